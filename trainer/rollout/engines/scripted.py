"""`ScriptedEngine`: replies with given texts as their canonical token ids, at zero model cost.

Each reply is `tokenizer.encode(text) + [<|im_end|>]` with logprob 0.0 per token: exactly the ids a
model would produce if it wrote that text canonically. It drives the episode loop in tests (scripted
moves, forced `length` / `abort` endings) and in the rollout-overhead benchmark, where it makes the
engine's share of a turn zero. It honours `max_new_tokens` as a real engine does: a reply that does
not fit is cut and finishes with `length`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import ClassVar, Literal

from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.sglang_api import FinishReason, PauseMode
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.weights.transport import TransportKind

__all__ = ["Responder", "ScriptedEngine"]

Responder = Callable[[int, GenerateRequest], str]
"""`respond(request_index, request) -> text`; `request_index` counts this engine's requests from 0."""

ScriptedFinish = Literal["stop", "length", "abort"]
CACHE_SIZE = 4096  # replies and images whose token counts are remembered


@dataclass(eq=False)
class ScriptedEngine:
    """An `Engine` whose replies come from a list (in request order) or a `Responder`.

    `finish="length"` leaves out the closing `<|im_end|>` and reports `length`; `finish="abort"` answers
    every request with an abort. A list that runs out aborts too, so a script never repeats silently.
    With `record`, every request is kept in `requests`, for tests to inspect. `weight_version` is what
    its results report; loading weights only changes it.
    """

    weight_transports: ClassVar[tuple[TransportKind, ...]] = ("disk",)

    processor: VLProcessor
    responses: Sequence[str] | Responder
    _: KW_ONLY
    finish: ScriptedFinish = "stop"
    weight_version: str = "0"
    record: bool = True
    calls: int = field(default=0, init=False)
    requests: list[GenerateRequest] = field(default_factory=list, init=False)
    _updates: int = field(default=0, init=False)
    _closed: bool = field(default=False, init=False)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self._resumed.set()
        self._encode = functools.lru_cache(maxsize=CACHE_SIZE)(self._canonical_ids)
        self._image_tokens = functools.lru_cache(maxsize=CACHE_SIZE)(self._count_image_tokens)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """The next scripted reply as canonical ids, cut to `max_new_tokens` (held while paused)."""
        await self._resumed.wait()
        index = self.calls
        self.calls += 1
        if self.record:
            self.requests.append(request)
        prompt_tokens = self._prompt_tokens(request)
        if self._closed:
            return GenerateResult.abort(request.rid, "engine is closed", self.weight_version, prompt_tokens)
        text = self._text(index, request)
        if text is None or self.finish == "abort":
            reason = "scripted abort" if text is not None else f"the script has no reply number {index}"
            return GenerateResult.abort(request.rid, reason, self.weight_version, prompt_tokens)
        ids = list(self._encode(text))
        if self.finish == "stop":
            ids.append(self.processor.ids.im_end)
        limit = request.sampling.max_new_tokens
        finish = FinishReason(type="stop", matched=self.processor.ids.im_end)
        if self.finish == "length" or len(ids) > limit:
            ids = ids[:limit]
            finish = FinishReason(type="length", length=limit)
        return GenerateResult(
            rid=request.rid,
            output_ids=ids,
            logprobs=[0.0] * len(ids),
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            weight_version=self.weight_version,
            text=text,
        )

    def _text(self, index: int, request: GenerateRequest) -> str | None:
        """The reply to request number `index`; None when a list script has run out."""
        if callable(self.responses):
            return self.responses(index, request)
        return self.responses[index] if index < len(self.responses) else None

    def _prompt_tokens(self, request: GenerateRequest) -> int:
        """The prompt length after pad expansion, as a real engine reports it."""
        return len(request.engine_ids) + sum(self._image_tokens(image) - 1 for image in request.images)

    def _canonical_ids(self, text: str) -> tuple[int, ...]:
        """The tokenizer's ids of `text` (cached, so scripted replies cost no tokenization)."""
        return tuple(self.processor.tokenizer.encode(text, add_special_tokens=False))

    def _count_image_tokens(self, image: str) -> int:
        """The pads one image expands to (cached: every turn resends the episode's earlier images)."""
        return self.processor.num_image_tokens(self.processor.image_grid(image))

    async def abort(self, rid: str) -> None:
        """Nothing runs long enough to abort."""

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """No weights to load: only the version changes."""
        self._updates += 1
        self.weight_version = weight_version or str(self._updates)
        return self.weight_version

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Hold new requests until `continue_generation` (none is ever in flight to abort)."""
        self._resumed.clear()

    async def continue_generation(self) -> None:
        """Let held requests through."""
        self._resumed.set()

    async def health(self) -> bool:
        """Healthy until closed."""
        return not self._closed

    async def close(self) -> None:
        """Later (and held) requests end with `abort`."""
        self._closed = True
        self._resumed.set()
