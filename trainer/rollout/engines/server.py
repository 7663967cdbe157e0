"""`create_app(engine)`: serve an `HFEngine` behind the subset of SGLang's native HTTP API vistarl uses.

With it the one-machine stack runs over the same HTTP path as production: rollout workers drive it
through `SGLangEngine` exactly as they drive SGLang. Endpoints: `POST /generate`, `GET /health`,
`GET /health_generate`, `GET /model_info`, `POST /update_weights_from_disk`, `POST /flush_cache` (the
prefix cache emptied), `POST /abort_request`, `POST /pause_generation`, `POST /continue_generation`,
`GET /metrics` (the batch loop's counters, `EngineStats`, and the error answers, in Prometheus' format),
and SGLang's NCCL weight update, `POST /init_weights_update_group` and
`POST /update_weights_from_distributed` (`vistarl.trainer.weights.receiver`: each bucket straight into
the parameters; gloo on CPU). Bodies and
answers are the shared models of `vistarl.trainer.rollout.engines.sglang_api`; like SGLang 0.5.23, an invalid
body (an unknown `sampling_params` key, say) gets 400. `POST /v1/chat/completions` is a minimal
OpenAI-compatible chat completion for agents (`vistarl.trainer.rollout.engines.chat`, docs/agents.md). The
body-size limit, the optional bearer token (`VISTARL_API_TOKEN`) and the error bodies are those of the env
servers too (`vistarl.httpserver`).

With `await_weights` (`vistarl engine serve --await-weights`, as `vistarl up` starts it) the server
generates nothing until a weight update completes: `/generate` requests wait, `/health_generate` answers
503, and `/model_info` reports `STARTING_VERSION`, which is no push's version. So a server restarted
under a running trainer serves only the weights the trainer pushes it (`vistarl.trainer.run.weight_keeper`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Literal

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from vistarl.clients.protocol import ErrorCode
from vistarl.httpserver.errors import (
    ServiceError,
    describe_validation_errors,
    error_response,
    install_error_handlers,
)
from vistarl.httpserver.guard import RequestGuard
from vistarl.httpserver.metrics import ServingMetrics
from vistarl.trainer.rollout.engines.base import EngineRequestError, GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.chat import (
    ChatCompletion,
    ChatCompletionRequest,
    completion,
    generate_request,
)
from vistarl.trainer.rollout.engines.hf import DEFAULT_MAX_BATCH_SIZE, DEFAULT_PREFIX_CACHE_MB, HFEngine
from vistarl.trainer.rollout.engines.sglang_api import (
    AbortBody,
    GenerateBody,
    GenerateResponse,
    InitWeightsUpdateGroupBody,
    MetaInfo,
    ModelInfo,
    PauseGenerationBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightsFromDistributedBody,
    UpdateWeightsResponse,
)
from vistarl.trainer.weights.receiver import WeightReceiver

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/health_generate", "/metrics"})
STARTING_VERSION = "default"
"""The weight version an awaiting server reports before its first update: SGLang's name for the weights a
server starts with, so a restarted `vistarl engine serve` and a restarted SGLang look alike."""


class EngineServerSettings(BaseSettings):
    """How `vistarl engine serve` listens and what it loads; CLI flags over `VISTARL_*` variables."""

    model_config = SettingsConfigDict(env_prefix="VISTARL_", env_ignore_empty=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=0, le=65535)
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    max_batch_size: int = Field(default=DEFAULT_MAX_BATCH_SIZE, ge=1)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="Request body limit (413).")
    api_token: SecretStr | None = Field(default=None, description="Bearer token required on all but health.")
    await_weights: bool = Field(default=False, description="Generate nothing before the first weight update.")
    cuda_graphs: bool = Field(default=True, description="Capture each decode step in a CUDA graph (GPU).")
    prefix_cache: bool = Field(default=True, description="Keep finished requests' KV cache for later turns.")
    prefix_cache_mb: int = Field(
        default=DEFAULT_PREFIX_CACHE_MB, ge=1, description="The prefix cache's bound."
    )

    @property
    def prefix_cache_bound_mb(self) -> int:
        """The engine's `prefix_cache_mb`: 0 when the prefix cache is off."""
        return self.prefix_cache_mb if self.prefix_cache else 0


def create_app(engine: HFEngine, settings: EngineServerSettings | None = None) -> FastAPI:
    """A FastAPI app serving `engine`; the engine is closed when the app shuts down."""
    settings = settings or EngineServerSettings()
    metrics = ServingMetrics("vistarl_engine")
    metrics.registry.register(EngineCollector(engine))
    receiver = WeightReceiver(engine.model.config.model_type)
    awaiting = settings.await_weights

    async def loaded() -> None:
        """A weight update completed (logged with its version): an awaiting server starts generating."""
        nonlocal awaiting
        log.info("serving weight version %s", engine.weight_version)
        if awaiting:
            awaiting = False
            await engine.continue_generation()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if awaiting:
            await engine.pause_generation("in_place")
        try:
            yield
        finally:
            receiver.close()
            await engine.close()

    app = FastAPI(title=f"vistarl engine: {engine.model_path}", lifespan=lifespan)
    install_error_handlers(app, metrics)
    app.add_exception_handler(RequestValidationError, _bad_request)
    token = None if settings.api_token is None else settings.api_token.get_secret_value()
    app.add_middleware(
        RequestGuard, max_bytes=settings.max_body_bytes, metrics=metrics, token=token, open_paths=OPEN_PATHS
    )

    @app.post("/generate")
    async def generate(body: GenerateBody) -> JSONResponse:
        """Generate from single-pad `input_ids` (or `text`) plus `image_data`; SGLang's answer shape."""
        request = _engine_request(engine, body)
        try:
            result = await engine.generate(request)
        except EngineRequestError as exc:
            raise ServiceError(ErrorCode.BAD_REQUEST, str(exc)) from exc
        answer = _sglang_answer(result, body.return_logprob)
        return JSONResponse(answer.model_dump(mode="json", exclude_none=True))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> ChatCompletion:
        """OpenAI's chat completion (no streaming, one choice): the messages and tools through the
        checkpoint's chat template, then the engine; `<tool_call>` blocks come back as `tool_calls`."""
        try:
            request = generate_request(engine.processor, body)
            result = await engine.generate(request)
        except (ValueError, EngineRequestError) as exc:
            raise ServiceError(ErrorCode.BAD_REQUEST, str(exc)) from exc
        if result.aborted:
            raise ServiceError(ErrorCode.INTERNAL, f"generation aborted: {result.finish_reason.message}")
        return completion(result, engine.model_path, with_tools=bool(body.offered_tools()))

    @app.get("/health")
    async def health() -> Response:
        """Liveness: the process answers."""
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """Readiness: 200 when a one-token generation succeeds, else 503."""
        return Response(status_code=200 if await engine.health() else 503)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        """Prometheus text exposition of the batch loop's counters and the error answers; never needs a
        token."""
        return metrics.response()

    @app.get("/model_info")
    async def model_info() -> ModelInfo:
        """The served checkpoint and the current weight version."""
        return ModelInfo(
            model_path=engine.model_path,
            tokenizer_path=engine.model_path,
            is_generation=True,
            weight_version=STARTING_VERSION if awaiting else engine.weight_version,
        )

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskBody) -> JSONResponse:
        """Load a checkpoint directory; waits for the running batch. 400 with `success: false` on failure."""
        if body.abort_all_requests:
            await engine.abort_all()
        try:
            version = await engine.update_weights_from_disk(body.model_path, body.weight_version)
        except EngineRequestError as exc:
            return _update_answer(False, str(exc))
        await loaded()
        return _update_answer(True, f"loaded {body.model_path} as weight_version {version}")

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(body: InitWeightsUpdateGroupBody) -> JSONResponse:
        """Join the trainer's weight-update group; answers once every rank has joined (bounded wait)."""
        try:
            await asyncio.to_thread(receiver.join, body)
        except (RuntimeError, ValueError) as exc:  # a timeout: RuntimeError
            return _update_answer(False, f"cannot join weight-update group {body.group_name!r}: {exc}")
        return _update_answer(True, f"joined weight-update group {body.group_name!r}")

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(body: UpdateWeightsFromDistributedBody) -> JSONResponse:
        """Receive one bucket from trainer rank 0 straight into the parameters, between batches; the bucket
        that flushes sets the version."""
        receive = functools.partial(receiver.receive_into, body)
        try:
            version = await engine.load_weights(receive, body.weight_version, final=body.flush_cache)
        except (EngineRequestError, RuntimeError) as exc:  # a broadcast timeout is a RuntimeError
            return _update_answer(False, f"bucket of {len(body.names)} tensors not loaded: {exc}")
        if body.flush_cache:
            await loaded()
        return _update_answer(True, f"loaded {len(body.names)} tensors; weight_version {version}")

    @app.post("/flush_cache")
    async def flush_cache() -> PlainTextResponse:
        """Empty the prefix cache once the running batch has ended (SGLang's radix cache flush)."""
        await engine.flush_cache()
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/pause_generation")
    async def pause_generation(body: PauseGenerationBody) -> dict[str, str]:
        """Start no new batch until /continue_generation; mode `abort` also aborts every request."""
        await engine.pause_generation(body.mode)
        return {"message": "Generation paused."}

    @app.post("/continue_generation")
    async def continue_generation() -> dict[str, str]:
        """Resume after /pause_generation; an awaiting server keeps waiting for its first update (a push
        that failed midway leaves weights no trainer version has)."""
        if not awaiting:
            await engine.continue_generation()
        return {"message": "Generation continued."}

    @app.post("/abort_request")
    async def abort_request(body: AbortBody) -> Response:
        """Abort one request (its /generate answers with finish_reason abort) or all of them."""
        if body.abort_all:
            await engine.abort_all()
        elif body.rid:
            await engine.abort(body.rid)
        return Response(status_code=200)

    return app


class EngineCollector(Collector):
    """The engine's `EngineStats`, read at each scrape: where the batch loop's time goes (prompt passes
    against the batches' whole time) and how full its batches run."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        counters = (
            ("batches", "Batches decoded.", stats.batches),
            ("rows", "Requests taken into batches, joining ones included.", stats.rows),
            ("joins", "Prompt passes that added requests to a running batch.", stats.joins),
            ("prompt_passes", "Prompt passes.", stats.prompt_passes),
            ("prompt_tokens", "Prompt tokens of the requests, image pads expanded.", stats.prompt_tokens),
            (
                "cached_prompt_tokens",
                "Prompt tokens whose keys and values came from the prefix cache.",
                stats.cached_prompt_tokens,
            ),
            (
                "computed_prompt_tokens",
                "Prompt tokens through the prompt passes.",
                stats.computed_prompt_tokens,
            ),
            ("prompt_seconds", "Seconds in prompt passes, their first tokens read.", stats.prompt_s),
            ("batch_seconds", "Seconds of the batches, their prompt passes included.", stats.batch_s),
            ("decode_steps", "Decode steps, one token for each live row.", stats.decode_steps),
            ("generated_tokens", "Tokens generated.", stats.generated_tokens),
        )
        for name, documentation, value in counters:
            yield CounterMetricFamily(f"vistarl_engine_{name}", documentation, value=value)
        yield GaugeMetricFamily(
            "vistarl_engine_largest_batch", "The most rows a batch held.", stats.largest_batch
        )
        yield GaugeMetricFamily(
            "vistarl_engine_queued_requests", "Requests waiting for a batch.", self.engine.queued
        )
        cache = self.engine.prefix_cache
        yield GaugeMetricFamily(
            "vistarl_engine_prefix_cache_bytes",
            "Bytes of keys and values the prefix cache holds.",
            cache.bytes if cache is not None else 0,
        )


def _engine_request(engine: HFEngine, body: GenerateBody) -> GenerateRequest:
    """The engine request of a `/generate` body; `text` is tokenized without special-token additions."""
    ids = body.input_ids
    if ids is None:
        ids = engine.processor.tokenizer.encode(body.text or "", add_special_tokens=False)
    try:
        return GenerateRequest(
            engine_ids=ids,
            images=body.images,
            sampling=body.sampling_params,
            rid=body.rid or uuid.uuid4().hex,
        )
    except ValidationError as exc:
        raise ServiceError(ErrorCode.BAD_REQUEST, describe_validation_errors(exc.errors())) from exc


def _update_answer(success: bool, message: str) -> JSONResponse:
    """SGLang's answer to a weight update: 200 on success, 400 with `success: false` otherwise."""
    answer = UpdateWeightsResponse(
        success=success, message=message, num_paused_requests=0 if success else None
    )
    return JSONResponse(answer.model_dump(exclude_none=True), status_code=200 if success else 400)


def _sglang_answer(result: GenerateResult, return_logprob: bool) -> GenerateResponse:
    """A result in SGLang's `/generate` answer shape."""
    logprobs: list[tuple[float, int, str | None]] | None = None
    if return_logprob:
        logprobs = [(lp, token, None) for lp, token in zip(result.logprobs, result.output_ids, strict=True)]
    meta = MetaInfo(
        id=result.rid,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=len(result.output_ids),
        cached_tokens=result.cached_tokens,
        finish_reason=result.finish_reason,
        output_token_logprobs=logprobs,
        weight_version=result.weight_version,
    )
    return GenerateResponse(text=result.text, output_ids=result.output_ids, meta_info=meta)


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    """SGLang answers an invalid body with 400 (the env servers use 422)."""
    assert isinstance(exc, RequestValidationError)
    return error_response(ErrorCode.BAD_REQUEST, describe_validation_errors(exc.errors()))
