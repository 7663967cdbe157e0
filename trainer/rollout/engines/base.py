"""What every generation engine takes and returns, and the `Engine` protocol the rollout drives.

A request carries `engine_ids` (one `<|image_pad|>` per image, see docs/tokens.md), the images as data
URLs in pad order, SGLang-named sampling params, and the episode it is a turn of. A result carries the
generated ids verbatim with one logprob each, why generation ended, the engine's prompt length after pad
expansion, and the weight version that produced it.

Failure contract: `generate` raises `EngineRequestError` when the request itself is wrong (resending
cannot help); every engine-side failure (unreachable, timed out, aborted, prompt length mismatch)
comes back as a result with `finish_reason.type == "abort"` and a message, which the rollout turns
into an ABORTED trajectory. Control calls (weights, abort) raise `EngineRequestError` when refused and
`EngineUnavailableError` when the engine cannot be reached.
"""

from __future__ import annotations

import uuid
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vistarl.trainer.rollout.engines.sglang_api import FinishReason, PauseMode, SamplingParams
from vistarl.trainer.weights.transport import TransportKind

UNKNOWN_VERSION = "unknown"
"""The weight version of a result from an engine that has reported none (a client that has heard nothing)."""


def policy_version_of(weight_version: str) -> int | None:
    """The policy version that generated with `weight_version`: a push names its number; any other name an
    engine reports (SGLang's `default`, a restarted `vistarl engine serve --await-weights`) means the
    checkpoint it started from, version 0, which no push of a later version made; None for
    `UNKNOWN_VERSION`. So an episode from a restarted engine's initial weights lags the trainer."""
    if weight_version == UNKNOWN_VERSION:
        return None
    return int(weight_version) if weight_version.isdigit() else 0


class EngineError(Exception):
    """Base of the errors engines raise."""


class EngineRequestError(EngineError, ValueError):
    """The request cannot be served as given (bad ids, images, params or credentials); do not resend it."""


class EngineUnavailableError(EngineError, ConnectionError):
    """A control call (health aside) got no answer from the engine within its retry deadline.

    A `ConnectionError`, so the commands report it as they report any unreachable service."""


class GenerateRequest(BaseModel):
    """One generation call: single-pad `engine_ids`, the images in pad order, SGLang sampling params."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_ids: list[int] = Field(min_length=1)
    images: list[str] = Field(default_factory=list, description="data URLs, one per image pad, in order")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    rid: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=256)
    session: str | None = Field(
        default=None,
        description="the episode the request is a turn of: an engine pool keeps its turns on one engine, "
        "which holds their shared prefix",
    )


class GenerateResult(BaseModel):
    """The generated ids (including a matched stop token) with one logprob each, and why it ended."""

    model_config = ConfigDict(frozen=True)

    rid: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int = Field(ge=0, description="the prompt length after image-pad expansion")
    cached_tokens: int = Field(default=0, ge=0, description="of those, the ones taken from a prefix cache")
    weight_version: str
    text: str = ""

    @model_validator(mode="after")
    def _one_logprob_per_id(self) -> GenerateResult:
        """Logprobs align with output ids one to one."""
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.output_ids)} output ids but {len(self.logprobs)} logprobs")
        return self

    @property
    def aborted(self) -> bool:
        """Whether the engine gave up on this request (see the module's failure contract)."""
        return self.finish_reason.type == "abort"

    @classmethod
    def abort(cls, rid: str, message: str, weight_version: str, prompt_tokens: int = 0) -> GenerateResult:
        """An abort result with no output, carrying `message` as the reason."""
        return cls(
            rid=rid,
            output_ids=[],
            logprobs=[],
            finish_reason=FinishReason(type="abort", message=message),
            prompt_tokens=prompt_tokens,
            weight_version=weight_version,
        )


@runtime_checkable
class Engine(Protocol):
    """A generation engine: SGLang over HTTP (`SGLangEngine`) or transformers in-process (`HFEngine`)."""

    @property
    def weight_version(self) -> str:
        """The version of the weights that generates now (the last one seen, for a remote engine)."""
        ...

    @property
    def weight_transports(self) -> tuple[TransportKind, ...]:
        """The transports that bring it new weights (`vistarl.trainer.weights`), `in_process` first if it is
        one."""
        ...

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one continuation; engine failures come back as abort results, never hang."""
        ...

    async def abort(self, rid: str) -> None:
        """End request `rid` early (queued or in flight); it then finishes with `abort`."""
        ...

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Load weights from an HF checkpoint directory; returns the new weight version."""
        ...

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Hold generation around a weight sync; `abort` also ends the requests in flight."""
        ...

    async def continue_generation(self) -> None:
        """Resume after `pause_generation`."""
        ...

    async def health(self) -> bool:
        """Whether the engine can generate now."""
        ...

    async def close(self) -> None:
        """Release the engine's connections or model thread; pending requests end with `abort`."""
        ...
