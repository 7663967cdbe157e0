"""`HFEngine`: in-process transformers generation with dynamic batching, for one machine and for tests.

Requests queue up; one background task takes up to `max_batch_size` of them at once and decodes them
together: one prompt pass over the prompts packed in one row (no padding; attention bounded per prompt,
on varlen FlashAttention on a GPU in bf16/fp16, else SDPA per prompt) with each prompt's own mRoPE
positions, then one token per step for every live row from a shared KV cache (`decode_cache`: grown per
step, or static in CUDA graphs on a GPU), each row with its own sampling params. Rows leave the batch as
they finish, and requests that arrive meanwhile join it between steps (their own prompt pass, its cache
placed beside theirs), up to `max_batch_size` rows, unless a weight update is waiting for the batch to
end. Before a batch starts, the loop waits while requests keep arriving (every `batch_wait_s`, up to
`max_batch_wait_s`), so the episodes of a rollout step that reach the engine together prefill together.

Sampling is one batched pass per step: top-k / top-p / min-p masks for every row at once, then an
inverse-CDF draw whose uniform is a hash of the row's seed (`sampling_seed`, else a random one) and the
token's index, so a seeded request draws the same tokens in any batch, and one host sync per step reads
every row's token and logprob. A batch runs whole on one dedicated model thread, which takes joining
requests from the queue between steps and hands each finished result to its caller's event loop, so
the event loop (HTTP, env I/O) keeps going and no decode step waits for it; a batch's weights never
change under it, because weight updates wait for the running batch and run on the same thread.

Semantics follow SGLang: single-pad `engine_ids` are expanded here; logprobs are
`log_softmax(logits / temperature)` before top-p / top-k / min-p (plain `log_softmax` when greedy);
output ids and logprobs include the matched stop token; `length` wins when the last allowed token is
also a stop token.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import AutoModelForImageTextToText, PreTrainedModel

from clients.errors import ImageError
from trainer.attention import (
    SEQUENCE_SDPA_ATTENTION,
    VARLEN_ATTENTION,
    SequenceBounds,
    attention_for,
    packed_attention_kwargs,
    use_attention,
)
from trainer.device import host_to_device
from trainer.image_features import encode_images, with_image_features
from trainer.rollout.engines.base import EngineRequestError, GenerateRequest, GenerateResult
from trainer.rollout.engines.decode_cache import DecodeRows, DynamicRows, Prefill, StaticDecoder
from trainer.rollout.engines.sglang_api import TOP_K_ALL, FinishReason, PauseMode, SamplingParams
from trainer.rollout.processor import PixelInputs, VLProcessor, checkpoint_dir
from trainer.weights.targets import WeightLoadError, copy_into
from trainer.weights.transport import TransportKind

log = logging.getLogger(__name__)

_Finish = Callable[["_Job", FinishReason], None]
"""How the batch loop hands a finished job over: with its reason, to the caller's event loop."""

DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_MAX_BATCH_WAIT_S = 0.1
DEFAULT_STATIC_CACHE_LEN = 4096
HEALTH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class _Prompt:
    """A request made ready for the model: expanded ids, pixel inputs, the ids that stop it, and its mRoPE
    positions `[3, 1, L]` (from 0) with the offset of the positions after it from its length."""

    input_ids: list[int]
    pixels: PixelInputs | None
    stop_ids: frozenset[int]
    positions: torch.Tensor
    rope_delta: int


@dataclass(eq=False)
class _Job:
    """One queued or running request and the future its caller awaits (compared by identity)."""

    request: GenerateRequest
    prompt: _Prompt
    future: asyncio.Future[GenerateResult]
    seed: int | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    abort_message: str | None = None

    @property
    def params(self) -> SamplingParams:
        return self.request.sampling


@dataclass
class EngineStats:
    """Counters of the batching loop: how many batches ran and how full they were."""

    batches: int = 0
    rows: int = 0
    largest_batch: int = 0
    static_batches: int = 0  # batches decoded from the static KV cache (CUDA graphs on a GPU)


class HFEngine:
    """Generation with a transformers Qwen-VL model in this process (CPU fp32 or GPU)."""

    weight_transports: ClassVar[tuple[TransportKind, ...]] = ("in_process",)

    def __init__(
        self,
        model: PreTrainedModel,
        processor: VLProcessor,
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        batch_wait_s: float = 0.005,
        max_batch_wait_s: float = DEFAULT_MAX_BATCH_WAIT_S,
        model_path: str | None = None,
        cuda_graphs: bool = True,
        static_cache_len: int | None = None,
    ) -> None:
        """`cuda_graphs`: on a GPU, decode from a static KV cache of `static_cache_len` positions a row
        (default: the context, at most `DEFAULT_STATIC_CACHE_LEN`) with each step in a CUDA graph.
        Without graphs (the CPU, or `cuda_graphs=False`), a `static_cache_len` decodes from the same
        static cache eagerly; none: HF's eager decode over a growing cache."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_batch_wait_s = max_batch_wait_s
        self.model_path = model_path or str(getattr(model, "name_or_path", "") or "in-memory")
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        text_config = model.config.get_text_config()
        self.max_context_len = int(text_config.max_position_embeddings)
        self.eos_ids = _eos_ids(model, processor)
        self.stats = EngineStats()
        self.static = _static_decoder(model, max_batch_size, cuda_graphs, static_cache_len)
        self.prompt_attention = SEQUENCE_SDPA_ATTENTION  # the packed prompt pass's attention
        if self.device.type == "cuda" and model.dtype in (torch.bfloat16, torch.float16):
            use_attention(model.model.visual, VARLEN_ATTENTION)  # one kernel a block, not one per image
            self.prompt_attention = VARLEN_ATTENTION
        self._weight_version = "0"
        self._updates = 0
        self._queue: collections.deque[_Job] = collections.deque()
        self._queue_lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._work = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._batch_lock = asyncio.Lock()
        self._updates_waiting = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vistarl-hf-engine")
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        cuda_graphs: bool = True,
        static_cache_len: int | None = None,
    ) -> HFEngine:
        """Load model and processor from a checkpoint directory; fp32 on CPU, bf16 on GPU by default.

        `model_path` is the directory's absolute path, which servers report to workers elsewhere."""
        directory = checkpoint_dir(path)
        model = _load_model(
            directory, device, dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
        )
        processor = VLProcessor.from_pretrained(directory)
        return cls(
            model,
            processor,
            max_batch_size=max_batch_size,
            model_path=directory,
            cuda_graphs=cuda_graphs,
            static_cache_len=static_cache_len,
        )

    @property
    def weight_version(self) -> str:
        return self._weight_version

    # --- requests ---------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Queue `request` for the next batch and wait for its result (see `base` for the contract)."""
        prompt = await asyncio.to_thread(self._prepare, request)
        if self._closed:
            return GenerateResult.abort(request.rid, "engine is closed", self._weight_version)
        job = _Job(request, prompt, asyncio.get_running_loop().create_future())
        if request.rid in self._jobs:
            raise EngineRequestError(f"request id {request.rid!r} is already in flight")
        self._jobs[request.rid] = job
        with self._queue_lock:
            self._queue.append(job)
        self._ensure_loop()
        self._work.set()
        try:
            return await job.future
        finally:
            self._jobs.pop(request.rid, None)
            self._dequeue(job)

    async def abort(self, rid: str) -> None:
        """End request `rid`: a queued one at once, a running one after the current step."""
        job = self._jobs.get(rid)
        if job is not None:
            self._abort_job(job, "aborted by request")

    async def abort_all(self) -> None:
        """Abort every queued and running request."""
        for job in list(self._jobs.values()):
            self._abort_job(job, "aborted by request")

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Start no new batch until `continue_generation`; `abort` also ends every request.

        The running batch, if any, finishes first (this engine does not retract requests); weight
        updates wait for it in any case.
        """
        self._resumed.clear()
        if mode == "abort":
            await self.abort_all()

    async def continue_generation(self) -> None:
        """Resume batching after `pause_generation`."""
        self._resumed.set()

    def _abort_job(self, job: _Job, message: str) -> None:
        """Resolve a queued job now; mark a running one, which the batch loop resolves after its step."""
        if self._dequeue(job):
            self._resolve(job, FinishReason(type="abort", message=message), self._weight_version)
        else:
            job.abort_message = message

    def _dequeue(self, job: _Job) -> bool:
        """Take `job` out of the queue if it is still there (the model thread takes jobs from it too)."""
        with self._queue_lock:
            if job not in self._queue:  # `remove` alone would raise an error that reprs the job's tensors
                return False
            self._queue.remove(job)
            return True

    def _take(self, count: int, fits: Callable[[_Job], bool] | None = None) -> list[_Job]:
        """Up to `count` queued jobs from the front, stopping at the first that does not `fit` (if given)."""
        taken: list[_Job] = []
        with self._queue_lock:
            while self._queue and len(taken) < count and (fits is None or fits(self._queue[0])):
                taken.append(self._queue.popleft())
        return taken

    # --- weights ----------------------------------------------------------------------------------

    async def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], weight_version: str | None = None, *, final: bool = True
    ) -> str:
        """Copy `state_dict` (all or some parameters, by live module names) into the model: `load_weights`
        with a copy. Every name and shape is checked before anything is copied."""
        return await self.load_weights(
            functools.partial(copy_into, tensors=state_dict), weight_version, final=final
        )

    async def load_weights(
        self,
        load: Callable[[Mapping[str, torch.Tensor]], None],
        weight_version: str | None = None,
        *,
        final: bool = True,
    ) -> str:
        """Run `load` on the model's live tensors (by live module name), on the model thread.

        Waits for the running batch, so no result mixes two weight versions. Returns the weight version,
        which changes only when `final`: a bucket of a bucketed update is not, and leaves the version to
        the last bucket, as SGLang does. A load that does not fit the model raises `EngineRequestError`.
        """
        self._updates_waiting += 1
        try:
            await self._batch_lock.acquire()
        finally:
            self._updates_waiting -= 1
        try:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, load, self.model.state_dict())
            except WeightLoadError as exc:
                raise EngineRequestError(str(exc)) from exc
            if final:
                self._updates += 1
                self._weight_version = weight_version or str(self._updates)
            return self._weight_version
        finally:
            self._batch_lock.release()

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Load an HF checkpoint directory of the same architecture and swap its weights in."""
        dtype = next(self.model.parameters()).dtype
        try:
            directory = checkpoint_dir(model_path)
            loaded = await asyncio.to_thread(_load_model, directory, "cpu", dtype)
        except (OSError, ValueError) as exc:
            raise EngineRequestError(f"cannot load a checkpoint from {model_path}: {exc}") from exc
        version = await self.update_weights(loaded.state_dict(), weight_version)
        self.model_path = directory
        return version

    # --- lifecycle --------------------------------------------------------------------------------

    async def health(self) -> bool:
        """Whether a one-token generation succeeds within `HEALTH_TIMEOUT_S` (never while paused)."""
        if not self._resumed.is_set():
            return False
        request = GenerateRequest(
            engine_ids=[self.processor.ids.im_start],
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
        )
        try:
            result = await asyncio.wait_for(self.generate(request), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, EngineRequestError):
            return False
        return not result.aborted

    async def close(self) -> None:
        """Stop the batch loop, abort what is pending, and release the model thread."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job in list(self._jobs.values()):
            self._resolve(job, FinishReason(type="abort", message="engine is closed"), self._weight_version)
        with self._queue_lock:
            self._queue.clear()
        await asyncio.to_thread(self._executor.shutdown, True)

    def _ensure_loop(self) -> None:
        """Start the batch loop on the running event loop (again, if a previous loop ended)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vistarl-hf-engine")

    # --- the batch loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        """Take up to `max_batch_size` queued jobs, decode them together, repeat.

        Should the loop itself fail, every waiting caller gets an abort result and the next
        `generate` starts a fresh loop.
        """
        try:
            while True:
                await self._work.wait()
                await self._resumed.wait()
                await self._gather_arrivals()
                jobs = self._take(self.max_batch_size)
                if not self._queue:
                    self._work.clear()
                if jobs:
                    async with self._batch_lock:
                        await self._decode(jobs)
        except Exception as exc:
            log.exception("HFEngine batch loop failed")
            failed = FinishReason(type="abort", message=f"engine failed: {exc!r}")
            for job in list(self._jobs.values()):
                self._resolve(job, failed, self._weight_version)

    async def _gather_arrivals(self) -> None:
        """Wait `batch_wait_s` at a time while the queue grows and has room, `max_batch_wait_s` at most."""
        if self.batch_wait_s <= 0:
            return
        deadline = time.monotonic() + max(self.max_batch_wait_s, self.batch_wait_s)
        while len(self._queue) < self.max_batch_size and time.monotonic() < deadline:
            waiting = len(self._queue)
            await asyncio.sleep(self.batch_wait_s)
            if len(self._queue) == waiting:
                return

    async def _decode(self, jobs: list[_Job]) -> None:
        """Run one batch to completion on the model thread, each job's result handed to its caller as
        soon as it finishes. The whole loop runs there, so no decode step waits for this event loop."""
        self.stats.batches += 1
        self.stats.rows += len(jobs)
        self.stats.largest_batch = max(self.stats.largest_batch, len(jobs))
        for job in jobs:
            job.seed = _seed(job.params)
        static = self.static is not None and all(self._fits_static(job) for job in jobs)
        rows: DecodeRows = self.static.rows() if self.static and static else DynamicRows(self.model)
        self.stats.static_batches += static
        loop = asyncio.get_running_loop()
        finish = functools.partial(self._hand_over, loop, self._weight_version)
        await loop.run_in_executor(self._executor, self._decode_batch, jobs, rows, static, finish)

    def _decode_batch(self, jobs: list[_Job], rows: DecodeRows, static: bool, finish: _Finish) -> None:
        """The batch loop on the model thread: prefill arrivals, hand over finished rows, step the rest.
        It stops between steps once the engine closes (`close` has aborted every job by then)."""
        live: list[_Job] = []
        tokens: list[int] = []
        logprobs: list[float] = []
        joining = jobs
        try:
            while not self._closed:
                if joining:
                    live = live + joining
                    more = self._prefill(joining, rows)
                    tokens, logprobs = tokens + more[0], logprobs + more[1]
                keep = self._advance(live, tokens, logprobs, finish)
                if not keep:
                    return
                live = [live[i] for i in keep]
                tokens, logprobs = self._step(rows, live, keep, [tokens[i] for i in keep])
                joining = self._admit(len(live), static)
        except Exception as exc:  # a failed forward pass ends its batch, never the engine
            log.exception("generation failed for a batch of %d rows", len(live))
            for job in live:
                finish(job, FinishReason(type="abort", message=f"generation failed: {exc!r}"))
        finally:
            rows.close()

    def _admit(self, running: int, static: bool) -> list[_Job]:
        """Queued jobs that join the running batch, up to `max_batch_size` rows, unless a weight update
        is waiting for the batch to end or generation is paused (their seeds set). A static batch takes
        them in order up to the first that does not fit its cache."""
        if self._updates_waiting or not self._resumed.is_set():
            return []
        joining = self._take(self.max_batch_size - running, self._fits_static if static else None)
        for job in joining:
            job.seed = _seed(job.params)
        self.stats.rows += len(joining)
        self.stats.largest_batch = max(self.stats.largest_batch, running + len(joining))
        return joining

    def _advance(
        self, jobs: list[_Job], tokens: list[int], logprobs: list[float], finish: _Finish
    ) -> list[int]:
        """Append each row's new token, `finish` finished or aborted rows; the indices of rows that go on."""
        keep = []
        for i, (job, token, logprob) in enumerate(zip(jobs, tokens, logprobs, strict=True)):
            if job.future.done():
                continue
            job.output_ids.append(token)
            job.logprobs.append(logprob)
            reason = self._finish_reason(job)
            if reason is None and job.abort_message is not None:
                reason = FinishReason(type="abort", message=job.abort_message)
            if reason is None:
                keep.append(i)
            else:
                finish(job, reason)
        return keep

    def _fits_static(self, job: _Job) -> bool:
        """Whether `job`'s prompt and token budget fit a row of the static KV cache."""
        static = self.static
        return static is not None and static.fits(len(job.prompt.input_ids), job.params.max_new_tokens)

    def _finish_reason(self, job: _Job) -> FinishReason | None:
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

    def _resolve(self, job: _Job, finish: FinishReason, version: str) -> None:
        """Hand the caller its result (unless it stopped waiting), on the event loop."""
        _deliver(job.future, self._result(job, finish, version))

    def _hand_over(
        self, loop: asyncio.AbstractEventLoop, version: str, job: _Job, finish: FinishReason
    ) -> None:
        """`_resolve` from the model thread: the result is built here, set on the caller's loop."""
        loop.call_soon_threadsafe(_deliver, job.future, self._result(job, finish, version))

    def _result(self, job: _Job, finish: FinishReason, version: str) -> GenerateResult:
        """The job's result as it stands."""
        return GenerateResult(
            rid=job.request.rid,
            output_ids=job.output_ids,
            logprobs=job.logprobs,
            finish_reason=finish,
            prompt_tokens=len(job.prompt.input_ids),
            weight_version=version,
            text=self._text(job, finish),
        )

    def _text(self, job: _Job, finish: FinishReason) -> str:
        """The decoded output, with a matched stop token or string trimmed unless `no_stop_trim`."""
        params = job.params
        ids = job.output_ids
        trim = finish.type == "stop" and not params.no_stop_trim
        if trim and isinstance(finish.matched, int):
            ids = ids[:-1]
        text: str = self.processor.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if trim and isinstance(finish.matched, str):
            text = text[: text.find(finish.matched)] if finish.matched in text else text
        return text

    # --- request preparation (worker threads) ------------------------------------------------------

    def _prepare(self, request: GenerateRequest) -> _Prompt:
        """Check the ids, decode the images, expand each single pad to the image's token count and find
        the prompt's mRoPE positions with the model's `get_rope_index` (here, off the model thread)."""
        ids = request.engine_ids
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        pads = ids.count(self.processor.ids.image_pad)
        if pads != len(request.images):
            raise EngineRequestError(
                f"engine_ids hold {pads} <|image_pad|> tokens for {len(request.images)} images; "
                "send exactly one pad per image (single-pad engine_ids)"
            )
        pixels = None
        input_ids = list(ids)
        if request.images:
            try:
                pixels = self.processor.pixel_inputs(request.images)
            except (ImageError, OSError, ValueError) as exc:
                raise EngineRequestError(f"bad image: {exc}") from exc
            input_ids = self.processor.expand_image_pads(ids, pixels.image_grid_thw.tolist())
        if len(input_ids) >= self.max_context_len:
            raise EngineRequestError(
                f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_context_len}"
            )
        params = request.sampling
        stop_ids = frozenset() if params.ignore_eos else self.eos_ids | frozenset(params.stop_token_ids or ())
        row = torch.tensor(input_ids)[None]
        positions, delta = self.model.model.get_rope_index(
            row,
            mm_token_type_ids=(row == self.processor.ids.image_pad).int(),
            image_grid_thw=pixels.image_grid_thw if pixels is not None else None,
        )
        return _Prompt(input_ids, pixels, stop_ids, positions, int(delta))

    # --- the model thread ---------------------------------------------------------------------------

    @torch.inference_mode()
    def _prefill(self, jobs: list[_Job], rows: DecodeRows) -> tuple[list[int], list[float]]:
        """Run the prompt pass over the prompts packed in one row, add them to `rows` and sample each
        first token from its prompt's last position.

        No padding and no mask: the text model's attention is bounded per prompt (`prompt_attention`),
        and each prompt's positions (found in `_prepare`) restart at 0. The layout (positions, bounds,
        image rows) is on the host and the images are encoded with their vision inputs precomputed
        (`trainer.image_features.encode_images`), so the prompt pass never waits for the GPU to learn a
        shape: HF's own path asks it several times per row.
        """
        prompts = [job.prompt for job in jobs]
        lengths = torch.tensor([len(p.input_ids) for p in prompts])
        ends = lengths.cumsum(0)
        input_ids = torch.tensor([token for p in prompts for token in p.input_ids])
        image_rows = (input_ids == self.processor.ids.image_pad).nonzero().squeeze(-1)
        to_device = functools.partial(host_to_device, device=self.device)  # copies that never wait
        bounds = SequenceBounds(to_device(torch.cat([ends.new_zeros(1), ends]).int()), int(lengths.max()))
        positions = to_device(torch.cat([p.positions for p in prompts], dim=2))  # each from 0
        next_positions = to_device(lengths + torch.tensor([p.rope_delta for p in prompts]))
        embeds = self.model.get_input_embeddings()(to_device(input_ids))[None]
        extra: dict[str, Any] = {}
        pixels = [p.pixels for p in prompts if p.pixels is not None]
        if pixels:
            pixel_values = torch.cat([p.pixel_values for p in pixels]).to(self.device, self.model.dtype)
            grid_thw = torch.cat([p.image_grid_thw for p in pixels])
            features = encode_images(self.model.model, pixel_values, grid_thw)
            embeds, extra = with_image_features(embeds, features, to_device(image_rows))
        text_model = self.model.model.language_model
        with attention_for(text_model, self.prompt_attention):
            out = text_model(  # Qwen3-VL's deepstack rows go in as given, one mask over the packed row
                inputs_embeds=embeds,
                position_ids=positions,
                use_cache=True,
                **extra,
                **packed_attention_kwargs(text_model.config, bounds),
            )
        rows.join(Prefill(out.past_key_values, lengths, next_positions))
        return _sample(self.model.lm_head(out.last_hidden_state[0, to_device(ends - 1)]), jobs)

    @torch.inference_mode()
    def _step(
        self, rows: DecodeRows, jobs: list[_Job], keep: list[int], tokens: list[int]
    ) -> tuple[list[int], list[float]]:
        """Keep the rows that go on, feed each its last token, and sample the next one."""
        return _sample(rows.step(keep, tokens), jobs)


def _deliver(future: asyncio.Future[GenerateResult], result: GenerateResult) -> None:
    """Set `future`'s result unless its caller stopped waiting."""
    if not future.done():
        future.set_result(result)


def _sample(logits: torch.Tensor, jobs: list[_Job]) -> tuple[list[int], list[float]]:
    """Pick each row's next token with its own params; its logprob is SGLang's (see the module doc)."""
    temperatures = torch.tensor(
        [1.0 if job.params.greedy else job.params.temperature for job in jobs], device=logits.device
    )
    logp = torch.log_softmax(logits.float() / temperatures[:, None], dim=-1)
    tokens = logp.argmax(dim=-1)
    drawn = [row for row, job in enumerate(jobs) if not job.params.greedy]
    if drawn:
        rows = torch.tensor(drawn, device=logits.device)
        sampled = [jobs[row] for row in drawn]
        uniforms = [_uniform(job.seed, len(job.output_ids)) for job in sampled]
        tokens[rows] = _draw(logp[rows].exp(), [job.params for job in sampled], uniforms)
    picked = torch.stack([tokens.double(), logp.gather(-1, tokens[:, None]).squeeze(-1).double()])
    ids, logprobs = picked.tolist()  # the step's one host sync
    return [int(t) for t in ids], logprobs


def _draw(probs: torch.Tensor, params: list[SamplingParams], uniforms: list[float]) -> torch.Tensor:
    """One id per row of `probs` `[R, V]`, restricted by top-k, then top-p, then min-p (as SGLang does),
    drawn by inverse CDF at the row's uniform."""
    if any(p.top_k != TOP_K_ALL or p.top_p < 1.0 or p.min_p > 0.0 for p in params):
        probs = _filtered(probs, params)
    cdf = probs.double().cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=torch.float64, device=probs.device)
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _filtered(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """`probs` with what each row's top-k, top-p (over the top-k, unrenormalised) and min-p drop set to 0."""
    vocab = probs.shape[-1]
    device = probs.device
    top_k = torch.tensor(
        [vocab if p.top_k == TOP_K_ALL else min(p.top_k, vocab) for p in params], device=device
    )
    top_p = torch.tensor([p.top_p for p in params], device=device)
    min_p = torch.tensor([p.min_p for p in params], device=device)
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = torch.arange(vocab, device=device)[None, :] < top_k[:, None]
    keep &= (ordered.cumsum(dim=-1) - ordered) < top_p[:, None]
    keep &= ordered >= min_p[:, None] * ordered[:, :1]
    return torch.zeros_like(probs).scatter_(-1, order, ordered * keep)


def _seed(params: SamplingParams) -> int | None:
    """The row's sampling seed: `sampling_seed` (reproducible) or a random one; none when greedy."""
    if params.greedy:
        return None
    return params.sampling_seed if params.sampling_seed is not None else random.getrandbits(63)


def _uniform(seed: int | None, index: int) -> float:
    """A uniform in [0, 1) from the row's seed and the index of the token drawn (splitmix64)."""
    x = ((seed or 0) * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((x ^ (x >> 31)) >> 11) / float(1 << 53)


_MASK64 = (1 << 64) - 1


def _static_decoder(
    model: PreTrainedModel, slots: int, cuda_graphs: bool, cache_len: int | None
) -> StaticDecoder | None:
    """The engine's static-cache decoder: with CUDA graphs on a GPU unless `cuda_graphs` is off; without
    them (the CPU, or graphs off) when a cache length is given; else None, for HF's eager decode."""
    if next(model.parameters()).device.type == "cuda" and cuda_graphs:
        context = int(model.config.get_text_config().max_position_embeddings)
        length = cache_len or min(context, DEFAULT_STATIC_CACHE_LEN)
        return StaticDecoder(model, slots=slots, cache_len=length, cuda_graphs=True)
    if cache_len is not None:
        return StaticDecoder(model, slots=slots, cache_len=cache_len, cuda_graphs=False)
    return None


def _eos_ids(model: PreTrainedModel, processor: VLProcessor) -> frozenset[int]:
    """`<|im_end|>` plus the model's generation-config EOS ids."""
    configured = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
    if configured is None:
        configured = []
    elif isinstance(configured, int):
        configured = [configured]
    return frozenset({processor.ids.im_end, *configured})


def _load_model(path: str | Path, device: str, dtype: torch.dtype) -> PreTrainedModel:
    """A Qwen-VL checkpoint through the same `from_pretrained` path a downloaded one uses (local only)."""
    model: PreTrainedModel = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=dtype, local_files_only=True
    )
    return model.to(device).eval()
