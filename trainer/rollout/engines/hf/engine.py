"""`HFEngine`: in-process transformers generation with dynamic batching, for one machine and for tests.

Requests queue up; one background task takes up to `max_batch_size` of them at once and decodes them
together (`batch.py`): one prompt pass over the prompts packed in one row, then one token per step for every
live row from a shared KV cache (`rows.py`: grown per step in `dynamic_rows.py`, or static on a GPU in
`static_decoder.py`), each row with its own sampling params (`sampling.py`). Rows leave the batch as they
finish, and requests that arrive meanwhile join it between steps, up to `max_batch_size` rows, unless a
weight update or a cache flush is waiting for the batch to end. Before a batch starts, the loop waits
while requests keep arriving (every `batch_wait_s`, up to `max_batch_wait_s`), so the episodes of a rollout
step that reach the engine together prefill together. The keys and values of finished requests stay in a
prefix cache (`prefix_cache.py`), so a conversation's next turn prefills only what it adds; weight updates
and `flush_cache` empty it.

A request is made ready off the model thread (`prompts.py`: ids checked, images decoded, positions found).
A batch runs whole on one dedicated model thread, which takes joining requests from the queue between
steps and hands each finished result to its caller's event loop, so the event loop (HTTP, env I/O) keeps
going and no decode step waits for it; a batch's weights never change under it, because weight updates
wait for the running batch and run on the same thread.

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
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from vistarl.trainer.modeling.attention import SEQUENCE_SDPA_ATTENTION, VARLEN_ATTENTION, use_attention
from vistarl.trainer.modeling.device import shorten_switch_interval, use_device
from vistarl.trainer.rollout.engines.base import EngineRequestError, GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf.batch import BatchRun, EngineStats, Job
from vistarl.trainer.rollout.engines.hf.dynamic_rows import DynamicRows
from vistarl.trainer.rollout.engines.hf.fused import Fusions
from vistarl.trainer.rollout.engines.hf.loading import load_model, static_decoder
from vistarl.trainer.rollout.engines.hf.prefix_cache import PrefixCache
from vistarl.trainer.rollout.engines.hf.prompts import PromptRules
from vistarl.trainer.rollout.engines.hf.rows import DecodeRows
from vistarl.trainer.rollout.engines.hf.sampling import RowSampling
from vistarl.trainer.rollout.engines.sglang_api import FinishReason, PauseMode, SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor, checkpoint_dir
from vistarl.trainer.weights.targets import WeightLoadError, copy_into
from vistarl.trainer.weights.transport import TransportKind

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_MAX_BATCH_WAIT_S = 0.1
DEFAULT_PREFIX_CACHE_MB = 8192
DEFAULT_GIL_SWITCH_MS = 0.05
HEALTH_TIMEOUT_S = 30.0


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
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
        gil_switch_ms: float = DEFAULT_GIL_SWITCH_MS,
        hold_joins: bool = True,
    ) -> None:
        """On a GPU the engine decodes from a static KV cache of `static_cache_len` positions a row
        (default: the context, at most 4,096); `cuda_graphs` captures each step in a CUDA graph and
        replays it (off: eager steps). On the CPU a `static_cache_len` decodes from the same static cache,
        eagerly; none: HF's eager decode over a growing cache. Finished requests' keys and values stay in a
        prefix cache of at most `prefix_cache_mb` MiB on the model's device (0: none).

        On a GPU the model thread takes the GIL back after every torch call of a prompt pass and at every
        decode step, and while another thread of the process runs Python (the event loop's envs, prompts,
        HTTP) the interpreter hands it over only every switch interval, 5 ms by default: `gil_switch_ms`
        lowers the process's interval to at most that (0: leave it as it is).

        With `hold_joins`, a request that arrives alone while a batch runs waits to join it until it has
        waited as long as the engine's mean prompt pass (`arrivals_settled`)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0: no prefix cache), got {prefix_cache_mb}")
        self.model = model.eval()
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_batch_wait_s = max_batch_wait_s
        self.hold_joins = hold_joins
        self.model_path = model_path or str(getattr(model, "name_or_path", "") or "in-memory")
        self.device = next(model.parameters()).device
        shorten_switch_interval(gil_switch_ms, self.device)
        self.prompts = PromptRules.of(model, processor)
        self.vocab_size = self.prompts.vocab_size
        self.stats = EngineStats()
        self.prefix_cache = PrefixCache(prefix_cache_mb << 20) if prefix_cache_mb else None
        self.fusions = Fusions.of(model)  # fused kernels for prompt passes and decode steps (`fused.py`)
        self.static = static_decoder(model, self.fusions, max_batch_size, cuda_graphs, static_cache_len)
        self.prompt_attention = SEQUENCE_SDPA_ATTENTION  # the packed prompt pass's attention
        if self.device.type == "cuda" and model.dtype in (torch.bfloat16, torch.float16):
            use_attention(model.model.visual, VARLEN_ATTENTION)  # one kernel a block, not one per image
            self.prompt_attention = VARLEN_ATTENTION
        self._weight_version = "0"
        self._updates = 0
        self._queue: collections.deque[Job] = collections.deque()
        self._queued_seen = 0  # the queue's length when the running batch last looked for joining jobs
        self._queue_lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._work = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._batch_lock = asyncio.Lock()
        self._holds_waiting = 0  # weight updates and cache flushes waiting for the running batch to end
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="vistarl-hf-engine",
            initializer=use_device,
            initargs=(self.device,),
        )
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
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
        gil_switch_ms: float = DEFAULT_GIL_SWITCH_MS,
        hold_joins: bool = True,
    ) -> HFEngine:
        """Load model and processor from a checkpoint directory; fp32 on CPU, bf16 on GPU by default.

        `model_path` is the directory's absolute path, which servers report to workers elsewhere."""
        directory = checkpoint_dir(path)
        model = load_model(directory, device, dtype or (torch.float32 if device == "cpu" else torch.bfloat16))
        processor = VLProcessor.from_pretrained(directory)
        return cls(
            model,
            processor,
            max_batch_size=max_batch_size,
            model_path=directory,
            cuda_graphs=cuda_graphs,
            static_cache_len=static_cache_len,
            prefix_cache_mb=prefix_cache_mb,
            gil_switch_ms=gil_switch_ms,
            hold_joins=hold_joins,
        )

    @property
    def weight_version(self) -> str:
        return self._weight_version

    @property
    def queued(self) -> int:
        """Requests waiting for a batch: prepared, not yet taken into one."""
        with self._queue_lock:
            return len(self._queue)

    # --- requests ---------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Queue `request` for the next batch and wait for its result (see `base` for the contract)."""
        prompt = await asyncio.to_thread(self.prompts.prepare, request)
        if self._closed:
            return GenerateResult.abort(request.rid, "engine is closed", self._weight_version)
        sampling = RowSampling.of(request.sampling, self.vocab_size)
        job = Job(request, prompt, asyncio.get_running_loop().create_future(), sampling)
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

    def _abort_job(self, job: Job, message: str) -> None:
        """Resolve a queued job now; mark a running one, which the batch loop resolves after its step."""
        if self._dequeue(job):
            self._resolve(job, FinishReason(type="abort", message=message), self._weight_version)
        else:
            job.abort_message = message

    def _dequeue(self, job: Job) -> bool:
        """Take `job` out of the queue if it is still there (the model thread takes jobs from it too)."""
        with self._queue_lock:
            if job not in self._queue:  # `remove` alone would raise an error that reprs the job's tensors
                return False
            self._queue.remove(job)
            return True

    def _take(self, count: int, fits: Callable[[Job], bool] | None = None) -> list[Job]:
        """Up to `count` queued jobs from the front, stopping at the first that does not `fit` (if given)."""
        taken: list[Job] = []
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

        Waits for the running batch, so no result mixes two weight versions, and empties the prefix cache,
        whose keys and values the old weights computed. Returns the weight version, which changes only when
        `final`: a bucket of a bucketed update is not, and leaves the version to the last bucket, as SGLang
        does. A load that does not fit the model raises `EngineRequestError`.
        """

        def loading() -> None:
            self._flush()
            load(self.model.state_dict())

        async with self._between_batches():
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, loading)
            except WeightLoadError as exc:
                raise EngineRequestError(str(exc)) from exc
            if final:
                self._updates += 1
                self._weight_version = weight_version or str(self._updates)
            return self._weight_version

    async def flush_cache(self) -> None:
        """Empty the prefix cache, once the running batch (if any) has ended."""
        async with self._between_batches():
            await asyncio.get_running_loop().run_in_executor(self._executor, self._flush)

    def _flush(self) -> None:
        """Empty the prefix cache (on the model thread, between batches)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @contextlib.asynccontextmanager
    async def _between_batches(self) -> AsyncIterator[None]:
        """Hold the batch loop between batches: wait for the running batch, which admits no joining
        request meanwhile, and start none until the block ends."""
        self._holds_waiting += 1
        try:
            await self._batch_lock.acquire()
        finally:
            self._holds_waiting -= 1
        try:
            yield
        finally:
            self._batch_lock.release()

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Load an HF checkpoint directory of the same architecture and swap its weights in."""
        dtype = next(self.model.parameters()).dtype
        try:
            directory = checkpoint_dir(model_path)
            loaded = await asyncio.to_thread(load_model, directory, "cpu", dtype)
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

    async def _decode(self, jobs: list[Job]) -> None:
        """Run one batch to completion on the model thread, each job's result handed to its caller as
        soon as it finishes. The whole loop runs there, so no decode step waits for this event loop."""
        self.stats.batches += 1
        with self._queue_lock:
            self._queued_seen = len(self._queue)
        self.stats.rows += len(jobs)
        self.stats.largest_batch = max(self.stats.largest_batch, len(jobs))
        static = self.static is not None and all(self._fits_static(job) for job in jobs)
        rows: DecodeRows = self.static.rows() if self.static and static else DynamicRows(self.model)
        self.stats.static_batches += static
        loop = asyncio.get_running_loop()
        run = BatchRun(
            self.model,
            self.processor,
            self.prompt_attention,
            admit=functools.partial(self._admit, static=static),
            closed=lambda: self._closed,
            finish=functools.partial(self._hand_over, loop, self._weight_version),
            stats=self.stats,
            prefixes=self.prefix_cache,
            fusions=self.fusions,
        )
        await loop.run_in_executor(self._executor, run.run, jobs, rows)

    def _admit(self, running: int, static: bool) -> list[Job]:
        """Queued jobs that join the running batch, up to `max_batch_size` rows, unless a weight update or a
        cache flush is waiting for the batch to end or generation is paused. A static batch takes them in
        order up to the first that does not fit its cache."""
        room = self.max_batch_size - running
        if self._holds_waiting or not self._resumed.is_set() or not self._arrivals_settled(room):
            return []
        joining = self._take(room, self._fits_static if static else None)
        with self._queue_lock:
            self._queued_seen = len(self._queue)
        self.stats.rows += len(joining)
        self.stats.joins += bool(joining)
        self.stats.largest_batch = max(self.stats.largest_batch, running + len(joining))
        return joining

    def _arrivals_settled(self, room: int) -> bool:
        """Whether queued jobs join the running batch now (`arrivals_settled`), from the queue as it is; a
        queue that fills the batch's `room` joins at once, as waiting could add no one."""
        with self._queue_lock:
            queued = len(self._queue)
            waited = time.monotonic() - self._queue[0].queued_at if queued else None
        seen, self._queued_seen = self._queued_seen, queued
        stats = self.stats
        hold = stats.prompt_s / stats.prompt_passes if self.hold_joins and stats.prompt_passes else 0.0
        return arrivals_settled(queued, seen, waited, self.max_batch_wait_s, 0.0 if queued >= room else hold)

    def _fits_static(self, job: Job) -> bool:
        """Whether `job`'s prompt and token budget fit a row of the static KV cache."""
        static = self.static
        return static is not None and static.fits(len(job.prompt.input_ids), job.params.max_new_tokens)

    def _resolve(self, job: Job, finish: FinishReason, version: str) -> None:
        """Hand the caller its result (unless it stopped waiting), on the event loop."""
        _deliver(job.future, self._result(job, finish, version))

    def _hand_over(
        self, loop: asyncio.AbstractEventLoop, version: str, job: Job, finish: FinishReason
    ) -> None:
        """`_resolve` from the model thread: the result is built here, set on the caller's loop."""
        loop.call_soon_threadsafe(_deliver, job.future, self._result(job, finish, version))

    def _result(self, job: Job, finish: FinishReason, version: str) -> GenerateResult:
        """The job's result as it stands."""
        return GenerateResult(
            rid=job.request.rid,
            output_ids=job.output_ids,
            logprobs=job.logprobs,
            finish_reason=finish,
            prompt_tokens=len(job.prompt.input_ids),
            cached_tokens=job.cached,
            weight_version=version,
            text=self._text(job, finish),
        )

    def _text(self, job: Job, finish: FinishReason) -> str:
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


def arrivals_settled(
    queued: int, seen: int, oldest_waited_s: float | None, max_wait_s: float, hold_s: float = 0.0
) -> bool:
    """Whether `queued` jobs join a running batch now: none arrived since the last look (`seen` were
    queued then) and the oldest has waited `hold_s`, or the oldest has waited `max_wait_s`.

    Joining each request of a burst as it comes would run a prompt pass per request, and each pass,
    Python-heavy, slows a server's event loop so the next request arrives later still. And a pass stalls
    every live row for as long as it runs: in a multi-turn rollout the turns arrive one at a time, and a
    pass for each took most of the engine's time (docs/engines.md, "Joining a running batch"), so a lone
    arrival waits `hold_s` (the engine's mean pass) for others to share its pass."""
    if queued == 0 or oldest_waited_s is None:
        return False
    if oldest_waited_s >= max_wait_s:
        return True
    return queued <= seen and oldest_waited_s >= hold_s


def _deliver(future: asyncio.Future[GenerateResult], result: GenerateResult) -> None:
    """Set `future`'s result unless its caller stopped waiting."""
    if not future.done():
        future.set_result(result)
