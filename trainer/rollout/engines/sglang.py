"""`SGLangEngine`: a client of SGLang's native HTTP API (or of `vistarl engine serve`, which speaks it).

Bodies are built from the shared models in `vistarl.trainer.rollout.engines.sglang_api`, so only SGLang's own
`sampling_params` names are ever sent. Each `/generate` sends single-pad `input_ids` plus the images
and checks the answer's `meta_info.prompt_tokens` against the locally expanded prompt length.

Every wait is bounded: connection failures and 429 / 503 answers are retried with jittered backoff
until `retry_deadline_s`; a `/generate` answer may take up to `generate_timeout_s`. An unreachable or
failing engine gives an abort result (see `vistarl.trainer.rollout.engines.base`), never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import ClassVar, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from vistarl.clients.calls import Reply, status_phrase
from vistarl.clients.http import TOKEN_ENV_VAR
from vistarl.clients.pool import LoopPool
from vistarl.clients.retry import RetryPolicy, attempt_until_final, retry_delay
from vistarl.trainer.rollout.engines.base import (
    UNKNOWN_VERSION,
    EngineRequestError,
    EngineUnavailableError,
    GenerateRequest,
    GenerateResult,
)
from vistarl.trainer.rollout.engines.sglang_api import (
    SERVER_KEEP_ALIVE_S,
    AbortBody,
    GenerateBody,
    GenerateResponse,
    InitWeightsUpdateGroupBody,
    ModelInfo,
    PauseGenerationBody,
    PauseMode,
    UpdateWeightsFromDiskBody,
    UpdateWeightsFromDistributedBody,
    UpdateWeightsResponse,
)
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.weights.transport import TransportKind

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

DEFAULT_MAX_CONNECTIONS = 1024
KEEPALIVE_EXPIRY_S = SERVER_KEEP_ALIVE_S - 1.0
"""How long this client reuses an idle connection: less than the server keeps it, so that it never sends a
request on a connection the server is closing. A `/generate` whose answer is lost is not resent (it is not
idempotent), so that race would abort an episode."""


class SGLangEngine:
    """Generation and control calls against one SGLang server (or router) at `url`.

    `processor` (the policy's `VLProcessor`) enables the prompt-length check; without it the check
    is skipped. `api_key` defaults to $VISTARL_API_TOKEN and is sent as a bearer token.
    """

    weight_transports: ClassVar[tuple[TransportKind, ...]] = ("disk", "nccl")

    def __init__(
        self,
        url: str,
        processor: VLProcessor | None = None,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        connect_timeout_s: float = 5.0,
        generate_timeout_s: float = 900.0,
        control_timeout_s: float = 30.0,
        weights_timeout_s: float = 600.0,
        retry_deadline_s: float = 60.0,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.processor = processor
        self.connect_timeout_s = connect_timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.control_timeout_s = control_timeout_s
        self.weights_timeout_s = weights_timeout_s
        self.retry = RetryPolicy.outage(retry_deadline_s)
        api_key = os.environ.get(TOKEN_ENV_VAR) if api_key is None else api_key
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool = LoopPool(
            "SGLangEngine", max_connections=max_connections, keepalive_s=KEEPALIVE_EXPIRY_S, headers=headers
        )
        self._weight_version = UNKNOWN_VERSION

    @property
    def weight_version(self) -> str:
        """The last weight version the server reported (in a result, `/model_info` or an update)."""
        return self._weight_version

    # --- generation -------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """`POST /generate` with single-pad `input_ids`; see `engines.base` for the contract."""
        expected = self.expected_prompt_tokens(request)
        body = GenerateBody(
            input_ids=request.engine_ids,
            image_data=request.images or None,
            sampling_params=request.sampling,
            return_logprob=True,
            rid=request.rid,
        )
        try:
            response = await self._send("POST", "/generate", body, self.generate_timeout_s, idempotent=False)
        except EngineUnavailableError as exc:
            return GenerateResult.abort(request.rid, str(exc), self._weight_version)
        if response.status >= 500 or response.status in self.retry.retry_statuses:
            message = f"{self.url}/generate answered {response.status}: {_error_message(response)}"
            return GenerateResult.abort(request.rid, message, self._weight_version)
        _raise_for_refusal(response, "/generate")
        try:
            answer = GenerateResponse.model_validate_json(response.body)
            return self._result(request.rid, answer, expected)
        except ValidationError as exc:
            message = f"{self.url}/generate answered a malformed body: {exc}"
            return GenerateResult.abort(request.rid, message, self._weight_version)

    def expected_prompt_tokens(self, request: GenerateRequest) -> int | None:
        """The prompt length after expanding each image pad (None without a processor)."""
        if self.processor is None:
            return None
        try:
            grids = [self.processor.image_grid(image) for image in request.images]
            return len(self.processor.expand_image_pads(request.engine_ids, grids))
        except ValueError as exc:
            raise EngineRequestError(f"cannot expand the prompt's image pads: {exc}") from exc

    def _result(self, rid: str, answer: GenerateResponse, expected: int | None) -> GenerateResult:
        """Turn an SGLang answer into a result, checking the prompt length and the logprobs."""
        meta = answer.meta_info
        version = meta.weight_version or self._weight_version
        self._weight_version = version
        if expected is not None and meta.prompt_tokens != expected:
            message = (
                f"prompt_tokens mismatch: the engine counted {meta.prompt_tokens} prompt tokens, the local "
                f"image-pad expansion gives {expected} (are the ids pre-expanded, or the images different?)"
            )
            return GenerateResult.abort(rid, message, version, meta.prompt_tokens)
        entries = meta.output_token_logprobs or []
        if [token for _, token, _ in entries] != answer.output_ids:
            message = (
                f"output_token_logprobs ({len(entries)}) do not match output_ids ({len(answer.output_ids)})"
            )
            return GenerateResult.abort(rid, message, version, meta.prompt_tokens)
        return GenerateResult(
            rid=rid,
            output_ids=answer.output_ids,
            logprobs=[logprob for logprob, _, _ in entries],
            finish_reason=meta.finish_reason,
            prompt_tokens=meta.prompt_tokens,
            cached_tokens=meta.cached_tokens,
            weight_version=version,
            text=answer.text,
        )

    # --- control ----------------------------------------------------------------------------------

    async def health(self) -> bool:
        """`GET /health_generate`, tried once: True when the server can generate."""
        try:
            session = self._pool.session()
            timeout = self._timeout(self.control_timeout_s)
            async with session.get(f"{self.url}/health_generate", timeout=timeout) as response:
                return 200 <= response.status < 300
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def model_info(self) -> ModelInfo:
        """`GET /model_info`; also refreshes `weight_version`."""
        response = await self._send("GET", "/model_info", None, self.control_timeout_s)
        info = _decode(response, ModelInfo, "/model_info")
        self._weight_version = info.weight_version or self._weight_version
        return info

    async def flush_cache(self) -> None:
        """`POST /flush_cache`: drop the prefix cache (SGLang refuses while requests run)."""
        await self._control("/flush_cache")

    async def abort(self, rid: str) -> None:
        """`POST /abort_request {rid}`; an unknown rid is not an error."""
        await self._control("/abort_request", AbortBody(rid=rid))

    async def abort_all(self) -> None:
        """`POST /abort_request {abort_all: true}`."""
        await self._control("/abort_request", AbortBody(abort_all=True))

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """`POST /pause_generation {mode}` before a weight sync (`abort`, `retract` or `in_place`)."""
        await self._control("/pause_generation", PauseGenerationBody(mode=mode))

    async def continue_generation(self) -> None:
        """`POST /continue_generation` after a weight sync."""
        await self._control("/continue_generation")

    async def _control(self, path: str, body: BaseModel | None = None) -> None:
        """POST a control call; an error status raises `EngineRequestError`."""
        _raise_for_refusal(await self._send("POST", path, body, self.control_timeout_s), path)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """`POST /update_weights_from_disk`; returns the server's weight version afterwards."""
        body = UpdateWeightsFromDiskBody(model_path=model_path, weight_version=weight_version)
        await self._update_weights("/update_weights_from_disk", body, weight_version)
        if weight_version is None:
            await self.model_info()
        return self._weight_version

    async def init_weights_update_group(self, body: InitWeightsUpdateGroupBody) -> UpdateWeightsResponse:
        """`POST /init_weights_update_group`. Blocks until the trainer joins the group: run concurrently."""
        return await self._update_weights("/init_weights_update_group", body, None)

    async def update_weights_from_distributed(
        self, body: UpdateWeightsFromDistributedBody
    ) -> UpdateWeightsResponse:
        """`POST /update_weights_from_distributed` for one bucket, while trainer rank 0 broadcasts it."""
        return await self._update_weights("/update_weights_from_distributed", body, body.weight_version)

    async def _update_weights(self, path: str, body: BaseModel, version: str | None) -> UpdateWeightsResponse:
        """Send a weight-update body; a refusal or `success: false` raises `EngineRequestError`."""
        response = await self._send("POST", path, body, self.weights_timeout_s, idempotent=False)
        answer = _decode(response, UpdateWeightsResponse, path)
        if not answer.success:
            raise EngineRequestError(f"{self.url}{path} failed: {answer.message}")
        self._weight_version = version or self._weight_version
        return answer

    async def close(self) -> None:
        """Close the connection pool."""
        await self._pool.close()

    # --- transport --------------------------------------------------------------------------------

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        """An attempt's timeouts: `connect_timeout_s` to get a connection, `seconds` of silence while the
        answer is awaited (a generation answers only when done), and both together as a backstop."""
        return aiohttp.ClientTimeout(
            total=seconds + self.connect_timeout_s, connect=self.connect_timeout_s, sock_read=seconds
        )

    async def _send(
        self, method: str, path: str, body: BaseModel | None, timeout: float, *, idempotent: bool = True
    ) -> Reply:
        """One call with bounded retries: unsent requests and 429 / 503 answers are resent until the
        retry deadline; a lost answer is resent only when `idempotent`. Raises `EngineUnavailableError`."""
        content = None if body is None else body.model_dump_json(exclude_none=True)
        headers = {"content-type": "application/json"} if content is not None else None
        url = self.url + path
        started = time.monotonic()

        async def attempt() -> Reply | Exception:
            try:
                session = self._pool.session()
                async with session.request(
                    method,
                    url,
                    data=content,
                    headers=headers,
                    timeout=self._timeout(timeout),
                    allow_redirects=False,
                ) as response:
                    body = await response.read()
                return Reply(response.status, body, url, response.headers.get("retry-after"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return exc

        def next_delay(outcome: Reply | Exception, attempts: int) -> float | None:
            remaining = self.retry.deadline_s - (time.monotonic() - started)
            delay = retry_delay(
                self.retry, outcome, attempt=attempts, idempotent=idempotent, remaining=remaining
            )
            if delay is not None:
                log.info("%s %s: %s, retry %d in %.2fs", method, path, _describe(outcome), attempts, delay)
            return delay

        outcome, attempts = await attempt_until_final(attempt, next_delay)
        if isinstance(outcome, Reply):
            return outcome
        elapsed = time.monotonic() - started
        raise EngineUnavailableError(
            f"{method} {self.url}{path} failed after {attempts} attempt(s) in {elapsed:.1f}s: "
            f"{type(outcome).__name__}: {outcome}"
        ) from outcome


def _describe(outcome: Reply | Exception) -> str:
    return str(outcome.status) if isinstance(outcome, Reply) else type(outcome).__name__


def _error_message(response: Reply) -> str:
    """The message of an error answer: SGLang's `{"error": {"message"}}`, FastAPI's `detail`, or the text."""
    try:
        body = json.loads(response.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text.strip()[:500] or status_phrase(response.status)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])
    return response.text.strip()[:500]


def _raise_for_refusal(response: Reply, path: str) -> None:
    """Raise `EngineRequestError` for any error status, with the server's message."""
    if response.status >= 400:
        raise EngineRequestError(f"{path} answered {response.status}: {_error_message(response)}")


def _decode(response: Reply, model: type[M], path: str) -> M:
    """Validate a body into `model`; an error status without such a body raises `EngineRequestError`."""
    try:
        return model.model_validate_json(response.body)
    except ValidationError:
        _raise_for_refusal(response, path)
        raise EngineRequestError(f"{path} answered a body that is not a {model.__name__}") from None
