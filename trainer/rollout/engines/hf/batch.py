"""One batch of the HF engine, run whole on its model thread: prompt passes, decode steps, finished rows.

Jobs that join run one prompt pass over their prompts packed in one row (no padding; attention bounded per
prompt, on varlen FlashAttention on a GPU in bf16/fp16, else SDPA per prompt), each with its own mRoPE
positions, and draw their first tokens from it. A prompt that begins with a finished request's tokens
(`prefix_cache.py`) takes their keys and values from the cache, and the pass computes only the rest of it;
a job that finishes leaves its own there. Then every live row decodes one token a step from the
batch's rows (`rows.py`). Each step is launched before the last one is read: while the device runs step
t + 1, the host reads step t, hands finished rows to their callers and takes the rows that go on into step
t + 2. A row that finished at step t has run one step more, whose token nobody reads. Requests that arrive
meanwhile join between steps, after the step in flight has been read, once their arrivals settle (the
engine's `_admit`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import PreTrainedModel

from vistarl.trainer.modeling.attention import SequenceBounds, attention_for, packed_attention_kwargs
from vistarl.trainer.modeling.device import host_to_device
from vistarl.trainer.modeling.image_features import encode_images, with_image_features
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf.fused import Fusions
from vistarl.trainer.rollout.engines.hf.prefix_cache import PrefixCache
from vistarl.trainer.rollout.engines.hf.prompts import Prompt
from vistarl.trainer.rollout.engines.hf.rows import DecodeRows, Prefill, PromptPassCache, Ready, Step
from vistarl.trainer.rollout.engines.hf.sampling import RowSampling, SamplingRows, sample
from vistarl.trainer.rollout.engines.sglang_api import FinishReason, SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor, concat_pixels

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One queued or running request and the future its caller awaits (compared by identity)."""

    request: GenerateRequest
    prompt: Prompt
    future: asyncio.Future[GenerateResult]
    sampling: RowSampling
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    abort_message: str | None = None
    done: bool = False  # handed over; its rows' later tokens are not read
    queued_at: float = field(default_factory=time.monotonic)
    cached: int = 0  # its prompt's tokens whose keys and values came from the prefix cache
    extends: int | None = None  # the prefix cache's entry they came from

    @property
    def params(self) -> SamplingParams:
        return self.request.sampling


Finish = Callable[[Job, FinishReason], None]
"""How the batch hands a finished job over: with its reason, to the caller's event loop."""


@dataclass
class EngineStats:
    """Counters of the batching loop: how many batches ran, how full they were, and where their time went
    (wall seconds on the model thread; a prompt pass's include reading its first tokens). Served at the
    engine server's `/metrics`."""

    batches: int = 0
    rows: int = 0
    largest_batch: int = 0
    static_batches: int = 0  # batches decoded from the static KV cache (always on a GPU)
    joins: int = 0  # prompt passes that added queued requests to a running batch
    prompt_passes: int = 0
    prompt_tokens: int = 0  # the prompts', each image's pads expanded: cached and computed ones
    cached_prompt_tokens: int = 0  # their keys and values taken from the prefix cache
    computed_prompt_tokens: int = 0  # through the prompt passes
    prompt_s: float = 0.0
    batch_s: float = 0.0  # the batches' whole time, their prompt passes included
    decode_steps: int = 0  # steps launched, each one token for every live row
    generated_tokens: int = 0

    def since(self, earlier: EngineStats) -> EngineStats:
        """What was counted after `earlier` (a copy taken then); `largest_batch` is the largest since ever."""
        delta = {f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        return EngineStats(**{**delta, "largest_batch": self.largest_batch})

    @classmethod
    def total(cls, parts: Sequence[EngineStats]) -> EngineStats:
        """Several engines' counters together; `largest_batch` is the largest of theirs."""
        summed = {f.name: sum(getattr(part, f.name) for part in parts) for f in fields(cls)}
        return cls(**{**summed, "largest_batch": max((p.largest_batch for p in parts), default=0)})


@dataclass
class BatchRun:
    """The batch loop's collaborators: the model, the prompt pass's attention, how joining jobs are taken
    (`admit`, given the rows running), whether the engine closed, how finished jobs are handed over, the
    engine's counters, its prefix cache (None: off), and the model's fused norms and projections.

    Finished jobs are handed over once per turn of the loop, after the counters have taken everything
    that went into them: whoever reads the counters once its results are in sees all of their work."""

    model: PreTrainedModel
    processor: VLProcessor
    prompt_attention: str
    admit: Callable[[int], list[Job]]
    closed: Callable[[], bool]
    finish: Finish
    stats: EngineStats
    prefixes: PrefixCache | None
    fusions: Fusions
    _finished: list[tuple[Job, FinishReason]] = field(default_factory=list, init=False)
    _counted: float = field(default=0.0, init=False)  # when the batch's time was last added to `stats`

    def run(self, jobs: list[Job], rows: DecodeRows) -> None:
        """Decode `jobs` and every job that joins them while some are running, until none is left or the
        engine closes (`close` aborts every job by then). A failure ends the batch with every unfinished
        job aborted."""
        batch: list[Job] = []
        live: list[Job] = []
        launched: tuple[list[Job], Step] | None = None
        joining = jobs
        self._counted = time.perf_counter()
        try:
            while not self.closed():
                self._deliver()
                if joining:
                    batch += joining
                    if launched is not None:
                        live = self._settle(live, rows, *launched)
                        launched = None
                    rows.keep(live)  # the rows that finished make room for those that join
                    live += self._timed_prefill(joining, rows)
                if not live:
                    return
                step = (live, rows.launch(live))
                self.stats.decode_steps += 1
                if launched is not None:
                    live = self._settle(live, rows, *launched)
                launched = step
                if not live:  # every row finished: what arrives next starts a batch of its own
                    return
                joining = self.admit(len(live))
        except Exception as exc:  # a failed forward pass ends its batch, never the engine
            log.exception("generation failed for a batch of %d rows", len(live))
            for job in batch:
                if not job.done:
                    self._hand_over(job, FinishReason(type="abort", message=f"generation failed: {exc!r}"))
        finally:
            rows.close()
            self._deliver()

    def _settle(self, live: list[Job], rows: DecodeRows, jobs: list[Job], step: Step) -> list[Job]:
        """Read `step` (launched for `jobs`), and the jobs of `live` that go on."""
        self._advance(jobs, rows, *step.results())
        return [job for job in live if not job.done]

    def _advance(
        self, jobs: list[Job], rows: DecodeRows, tokens: list[int], logprobs: list[float]
    ) -> list[Job]:
        """Append each unfinished job's new token, hand over the jobs it ends (keeping the prefixes of those
        that ended on a stop or their length), and return those that go on."""
        going = []
        for job, token, logprob in zip(jobs, tokens, logprobs, strict=True):
            if job.done:
                continue
            job.output_ids.append(token)
            job.logprobs.append(logprob)
            self.stats.generated_tokens += 1
            reason = self._finish_reason(job)
            if reason is None and job.abort_message is not None:
                reason = FinishReason(type="abort", message=job.abort_message)
            if reason is None:
                going.append(job)
                continue
            if reason.type != "abort":
                self._keep_prefix(job, rows)
            self._hand_over(job, reason)
        return going

    def _keep_prefix(self, job: Job, rows: DecodeRows) -> None:
        """Put `job`'s prompt and its output but the last token (which no step has run through the model) in
        the prefix cache, if there is one: the next turn of its conversation begins with them."""
        if self.prefixes is None:
            return
        length = len(job.prompt.input_ids) + len(job.output_ids) - 1
        key = job.prompt.key.extended(job.output_ids[:-1])
        if key.blocks:
            self.prefixes.store(key, rows.prefix_of(job, length), extends=job.extends)

    def _hand_over(self, job: Job, reason: FinishReason) -> None:
        job.done = True
        self._finished.append((job, reason))

    def _deliver(self) -> None:
        """Add the batch's time since the last call to `stats`, then hand over the jobs finished since."""
        now = time.perf_counter()
        self.stats.batch_s += now - self._counted
        self._counted = now
        finished, self._finished = self._finished, []
        for job, reason in finished:
            self.finish(job, reason)

    def _finish_reason(self, job: Job) -> FinishReason | None:
        """SGLang's order of checks: the length budget, then stop ids, then stop strings."""
        params = job.params
        if len(job.output_ids) >= params.max_new_tokens:
            return FinishReason(type="length", length=params.max_new_tokens)
        if job.output_ids[-1] in job.prompt.stop_ids:
            return FinishReason(type="stop", matched=job.output_ids[-1])
        if params.stop_strings:
            text = self.processor.tokenizer.decode(job.output_ids)
            for stop in params.stop_strings:
                if stop in text:
                    return FinishReason(type="stop", matched=stop)
        return None

    def _timed_prefill(self, jobs: list[Job], rows: DecodeRows) -> list[Job]:
        """`_prefill` with the model's norms, projections and rotary embedding fused, counted in `stats`."""
        started = time.perf_counter()
        with self.fusions.applied():
            going = self._prefill(jobs, rows)
        prompts = sum(len(job.prompt.input_ids) for job in jobs)
        cached = sum(job.cached for job in jobs)
        self.stats.prompt_passes += 1
        self.stats.prompt_tokens += prompts
        self.stats.cached_prompt_tokens += cached
        self.stats.computed_prompt_tokens += prompts - cached
        self.stats.prompt_s += time.perf_counter() - started
        return going

    @torch.inference_mode()
    def _prefill(self, jobs: list[Job], rows: DecodeRows) -> list[Job]:
        """Run the prompt pass over the prompts packed in one row, each but its cached prefix, draw each
        first token from its prompt's last position, add the prompts to `rows`, and return the jobs that go
        on.

        No padding and no mask: the text model's attention is bounded per prompt (`prompt_attention`), its
        queries the tokens computed, its keys the whole prompt's; each prompt's positions (found in
        `prompts.py`) start at 0 or where its cached prefix ends. The layout (positions, bounds, image rows)
        is on the host and the images are encoded with their vision inputs precomputed
        (`vistarl.trainer.modeling.image_features.encode_images`), so the prompt pass never waits for the GPU
        to learn a shape: HF's own path asks it several times per row.
        """
        device = self.model.device
        hits = [self.prefixes.match(job.prompt.key) if self.prefixes is not None else None for job in jobs]
        for job, hit in zip(jobs, hits, strict=True):
            job.cached, job.extends = (hit.length, hit.entry.id) if hit is not None else (0, None)
        rests = [job.prompt.rest(job.cached) for job in jobs]
        computed = torch.tensor([len(rest.input_ids) for rest in rests])
        lengths = torch.tensor([len(job.prompt.input_ids) for job in jobs])
        input_ids = torch.tensor([token for rest in rests for token in rest.input_ids])
        image_rows = (input_ids == self.processor.ids.image_pad).nonzero().squeeze(-1)
        to_device = functools.partial(host_to_device, device=device)  # copies that never wait
        bounds = _bounds(computed, to_device)
        cached = any(hit is not None for hit in hits)
        whole = _bounds(lengths, to_device) if cached else None  # the keys' bounds, when they differ
        positions = to_device(torch.cat([rest.positions for rest in rests], dim=2))
        next_positions = to_device(lengths + torch.tensor([job.prompt.rope_delta for job in jobs]))
        embeds = self.model.get_input_embeddings()(to_device(input_ids))[None]
        extra: dict[str, Any] = {}
        images = [image for rest in rests for image in rest.images]
        if images:  # one concatenation, into pinned memory on a GPU, and one copy that never waits
            pixels = concat_pixels(images, pin_memory=device.type == "cuda")
            pixel_values = pixels.pixel_values.to(device, non_blocking=True).to(self.model.dtype)
            features = encode_images(self.model.model, pixel_values, pixels.image_grid_thw)
            embeds, extra = with_image_features(embeds, features, to_device(image_rows))
        cache = PromptPassCache([hit.kv if hit is not None else None for hit in hits], computed.tolist())
        text_model = self.model.model.language_model
        with attention_for(text_model, self.prompt_attention):
            out = text_model(  # Qwen3-VL's deepstack rows go in as given, one mask over the packed row
                inputs_embeds=embeds,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **extra,
                **packed_attention_kwargs(text_model.config, bounds, whole),
            )
        settings = [job.sampling for job in jobs]
        logits = self.model.lm_head(out.last_hidden_state[0, to_device(computed.cumsum(0) - 1)])
        mode = max(setting.mode for setting in settings)
        index = torch.zeros(len(jobs), dtype=torch.long, device=device)  # each row draws its token 0
        tokens, logprobs = sample(logits, SamplingRows.of(settings, device), index, mode)
        rows.join(Prefill(cache, lengths, next_positions), jobs, settings, tokens)
        return self._advance(jobs, rows, *Ready(tokens, logprobs).results())


def _bounds(lengths: torch.Tensor, to_device: Callable[[torch.Tensor], torch.Tensor]) -> SequenceBounds:
    """The bounds of sequences of `lengths` (host int64) packed in one row, `cu_seqlens` on the device."""
    ends = lengths.cumsum(0)
    return SequenceBounds(to_device(torch.cat([ends.new_zeros(1), ends]).int()), int(lengths.max()))
