"""The environment-server wire protocol: every request and response body, defined once.

Both the servers (`services/`) and the clients (`clients/http.py`, the rollout workers) import
these models, so the two sides cannot drift apart. Images travel as PNG data URLs
(`data:image/png;base64,...`), the same strings that go into OpenAI `image_url` parts and into
SGLang's `image_data`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

PROTOCOL_VERSION = "1"
TASK_ID_FORM = "SPLIT/INDEX: a split listed under datasets.splits and a row index from 0, e.g. test/17"
T = TypeVar("T")

SEED_LIMIT = 2**63
"""Seeds lie in [-SEED_LIMIT, SEED_LIMIT): a signed 64-bit integer, as every client language and the
trajectory records (msgpack) hold one."""


def _seed_in_range(value: Any) -> Any:
    """Refuse a numeric seed outside the 64-bit range with a message naming the range; a big JSON number
    (a float past 2**53, as JavaScript writes 2**70) would otherwise read as "Unable to parse"."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and not -SEED_LIMIT <= value < SEED_LIMIT:
        raise ValueError(f"a seed is an integer from -2**63 to 2**63 - 1, got {value:g}")
    return value


Seed = Annotated[int, Field(ge=-SEED_LIMIT, le=SEED_LIMIT - 1), BeforeValidator(_seed_in_range)]
"""A task's seed: a signed 64-bit integer (the bounds are published in the schema)."""


WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1
"""The integers a free-form JSON value may hold: what msgpack carries between the server's processes (its
env workers, the shared session store) and into trajectories."""
MAX_JSON_DEPTH = 100
"""How deep a free-form JSON value may nest."""


def travel_problem(value: Any, path: str = "", depth: int = 0) -> str | None:
    """What keeps a JSON value from travelling through every hop (`path: what`), or None: an integer
    outside [WIRE_INT_MIN, WIRE_INT_MAX], a number that is not finite, text that is not valid Unicode (a
    lone surrogate), nesting deeper than MAX_JSON_DEPTH."""
    where = path or "the value"
    if depth > MAX_JSON_DEPTH:
        return f"{where}: nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, dict):
        inner = [(f"{path}.{key}" if path else str(key), item) for key, item in value.items()]
        keys = (_scalar_problem(key, f"a key of {where}") for key in value)
        return next((problem for problem in keys if problem), None) or _first_problem(inner, depth)
    if isinstance(value, list | tuple):
        return _first_problem([(f"{path}[{index}]", item) for index, item in enumerate(value)], depth)
    return _scalar_problem(value, where)


def _first_problem(items: list[tuple[str, Any]], depth: int) -> str | None:
    """The first problem among the (path, value) members of a container at `depth`."""
    return next((p for p in (travel_problem(item, path, depth + 1) for path, item in items) if p), None)


def _scalar_problem(value: Any, where: str) -> str | None:
    """What is wrong with a number or a text, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
        return f"{where}: an integer of {len(str(abs(value)))} digits is outside -2**63 to 2**64 - 1"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value} is not a finite number"
    if isinstance(value, str) and not (value.isascii() or _unicode(value)):
        return f"{where}: text with a lone surrogate"
    return None


def _unicode(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _travels(value: T) -> T:
    """Refuse a free-form value that `travel_problem` finds fault with, naming where in it."""
    problem = travel_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


JSONObject = Annotated[dict[str, Any], AfterValidator(_travels)]
"""A free-form JSON object that every hop carries as it is (`travel_problem`): anything else is a 422
naming the field, and where in it."""


class _Strict(BaseModel):
    """Base for request bodies: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


# --- observations and chat messages ----------------------------------------------------------


class Observation(BaseModel):
    """What the environment shows the agent: text, images (data URLs) and free-form metadata."""

    text: str = ""
    images: list[str] = Field(default_factory=list)
    metadata: JSONObject = Field(default_factory=dict)


class ImageURL(BaseModel):
    url: str


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ImagePart(BaseModel):
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    """An OpenAI-compatible chat message; `content` is a string or a list of content parts."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart]


# --- endpoint bodies --------------------------------------------------------------------------


class ResetRequest(_Strict):
    """Start an episode from at most one task: `seed` (a generated task; it overrides any seed among
    the options), `task_id` (a row of a split the server holds, `SPLIT/INDEX`) or `sample` (a whole
    row inline, images as data URLs). With none, the env picks a task."""

    seed: Seed | None = None
    task_id: str | None = Field(default=None, min_length=1, max_length=256)
    sample: JSONObject | None = None
    options: JSONObject = Field(default_factory=dict)
    session_id: str | None = Field(default=None, min_length=1, max_length=128)
    format: bool = False

    @model_validator(mode="after")
    def _one_task(self) -> ResetRequest:
        given = [name for name in ("seed", "task_id", "sample") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of seed, task_id and sample, not {' and '.join(given)}")
        return self


class ResetResponse(BaseModel):
    session_id: str
    observation: Observation
    info: dict[str, Any] = Field(default_factory=dict)
    message: Message | None = None


class ToolCall(_Strict):
    """A call of one of the env's tools (`tools` in `/info`), as chat-completion APIs return it in
    `tool_calls[i].function`: `arguments` is a JSON object, or the JSON text of one."""

    name: str = Field(min_length=1, max_length=256)
    arguments: Annotated[dict[str, Any] | str, AfterValidator(_travels)] = Field(default_factory=dict)


def _action_optional(schema: dict[str, Any]) -> None:
    """`StepRequest`'s published schema: `action` may be left out when a `tool_call` is sent."""
    schema["required"] = [name for name in schema["required"] if name != "action"]


class StepRequest(_Strict):
    """One turn: the response text as `action`, or instead a `tool_call` of the env's tools, which the
    server turns into the response text it stands for."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_action_optional)

    session_id: str = Field(min_length=1, max_length=128)
    action: str
    tool_call: ToolCall | None = None
    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    format: bool = False

    @model_validator(mode="before")
    @classmethod
    def _action_or_tool_call(cls, data: Any) -> Any:
        """A tool call stands for the action, so it comes without one (or with an empty one); a turn needs
        one of the two."""
        if not isinstance(data, dict):
            return data
        if data.get("tool_call") is None:
            if "action" not in data:
                raise ValueError("a step needs action (the response text) or tool_call (a call of a tool)")
            return data
        if data.get("action"):
            raise ValueError("give the turn as action or as tool_call, not both")
        return {**data, "action": ""}


class StepResponse(BaseModel):
    """One turn's answer. `done` says the episode is over; `truncated` says it was a budget of the env
    (its turn or move limit) that ended it, not an ending of its own (Gymnasium's `terminated`)."""

    observation: Observation
    reward: float
    done: bool
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    message: Message | None = None

    @model_validator(mode="after")
    def _truncated_is_done(self) -> StepResponse:
        """A truncated episode is over too."""
        if self.truncated and not self.done:
            raise ValueError("truncated is set but done is not: a truncated episode is done")
        return self

    @property
    def terminated(self) -> bool:
        """Whether the episode reached an ending of its own (Gymnasium's name): done and not truncated."""
        return self.done and not self.truncated


def episode_reward(turn_rewards: Sequence[float], info: Mapping[str, Any]) -> float:
    """An episode's reward: the env's own `info["episode_reward"]`, which an env gives on the episode's last
    turn, else the sum of its turn rewards (an episode that ended before the env gave one). vistarl's
    trainer and the TRL envs (`clients/trl.py`) both read an episode's reward so."""
    given = info.get("episode_reward")
    return float(given) if given is not None else float(sum(turn_rewards))


class FormatRequest(_Strict):
    observation: Observation


class FormatResponse(BaseModel):
    message: Message


class Limits(BaseModel):
    """The server's bounds, published in `/info` so clients can size their requests."""

    max_sessions: int
    session_ttl_s: float
    max_body_bytes: int
    max_image_bytes: int
    max_image_pixels: int
    max_action_chars: int
    idempotency_cache_size: int
    """Step answers kept per session for retries with the same `request_id`."""
    env_timeout_s: float
    """Bound on one env call (reset, step, format, close); past it the call answers 500."""
    retry_after_s: int
    """The `Retry-After` of 503 answers."""


class SplitInfo(BaseModel):
    """One split of tasks a server holds."""

    name: str
    size: int


class Datasets(BaseModel):
    """The tasks `/reset` can start from: the server's splits (by `task_id`) and inline samples."""

    task_id_form: str = TASK_ID_FORM
    splits: list[SplitInfo] = Field(default_factory=list)
    sample_schema: dict[str, Any] | None = None
    """The JSON schema of a `sample`; None when the env takes no samples."""


class InfoResponse(BaseModel):
    name: str
    version: str
    description: str
    system_prompt: str
    action_format: str
    config_schema: dict[str, Any]
    limits: Limits
    datasets: Datasets = Field(default_factory=Datasets)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The env's actions as OpenAI function-tool schemas."""
    protocol_version: str = PROTOCOL_VERSION


class HealthResponse(BaseModel):
    """`GET /health`: the process answers. `healthy` is OpenEnv's value (its `HealthStatus`), so that
    `openenv validate` and OpenEnv's tools read a vistarl server as they read their own."""

    status: Literal["healthy"] = "healthy"


class ReadyResponse(BaseModel):
    ready: bool
    active_sessions: int
    max_sessions: int
    draining: bool


# --- errors -----------------------------------------------------------------------------------


class ErrorCode(str, Enum):
    """Machine-readable error codes; each maps to one HTTP status."""

    BAD_REQUEST = "bad_request"
    INVALID_OPTIONS = "invalid_options"
    VALIDATION_ERROR = "validation_error"
    INVALID_IMAGE = "invalid_image"
    INVALID_SAMPLE = "invalid_sample"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    MISDIRECTED = "misdirected_request"
    NOT_FOUND = "not_found"
    SESSION_NOT_FOUND = "session_not_found"
    TASK_NOT_FOUND = "task_not_found"
    SESSION_EXISTS = "session_exists"
    REQUEST_ID_REUSED = "request_id_reused"
    EPISODE_DONE = "episode_done"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    AT_CAPACITY = "at_capacity"
    DRAINING = "draining"
    SESSION_BUSY = "session_busy"
    STORE_UNAVAILABLE = "store_unavailable"
    INTERNAL = "internal_error"


ERROR_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.INVALID_OPTIONS: 422,
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.INVALID_IMAGE: 422,
    ErrorCode.INVALID_SAMPLE: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.MISDIRECTED: 421,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.SESSION_NOT_FOUND: 404,
    ErrorCode.TASK_NOT_FOUND: 404,
    ErrorCode.SESSION_EXISTS: 409,
    ErrorCode.REQUEST_ID_REUSED: 409,
    ErrorCode.EPISODE_DONE: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.AT_CAPACITY: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.SESSION_BUSY: 503,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every non-2xx body: `{"error": {"code": ..., "message": ...}}`."""

    error: ErrorDetail

    @classmethod
    def of(cls, code: ErrorCode | str, message: str) -> ErrorResponse:
        return cls(error=ErrorDetail(code=ErrorCode(code).value, message=message))


# --- OpenEnv's WebSocket session protocol: /ws, /schema, /metadata ----------------------------

OPENENV_CORE_VERSION = "0.3.0"
"""The `openenv-core` release whose protocol `/ws`, `/schema` and `/metadata` speak (its `EnvClient`,
`GenericEnvClient` and `env_server.types`; the `openenv` extra pins it)."""
_BUILT_AT_FIRST_USE = ConfigDict(defer_build=True)
"""The OpenEnv models are built when first used, not at import: a server that no OpenEnv client asks
starts without paying for them (docs/benchmarks.md, "Start-up")."""


OpenEnvErrorCode = Literal[
    "INVALID_JSON",
    "UNKNOWN_TYPE",
    "VALIDATION_ERROR",
    "EXECUTION_ERROR",
    "CAPACITY_REACHED",
    "FACTORY_ERROR",
    "SESSION_ERROR",
]
"""OpenEnv's error codes (its `WSErrorCode`), the `code` of an error answer on `/ws`."""


OPENENV_ERROR_CODES: dict[ErrorCode, OpenEnvErrorCode] = {
    ErrorCode.BAD_REQUEST: "VALIDATION_ERROR",
    ErrorCode.INVALID_OPTIONS: "VALIDATION_ERROR",
    ErrorCode.VALIDATION_ERROR: "VALIDATION_ERROR",
    ErrorCode.INVALID_IMAGE: "VALIDATION_ERROR",
    ErrorCode.INVALID_SAMPLE: "VALIDATION_ERROR",
    ErrorCode.TASK_NOT_FOUND: "VALIDATION_ERROR",
    ErrorCode.PAYLOAD_TOO_LARGE: "VALIDATION_ERROR",
    ErrorCode.REQUEST_ID_REUSED: "VALIDATION_ERROR",
    ErrorCode.AT_CAPACITY: "CAPACITY_REACHED",
    ErrorCode.DRAINING: "CAPACITY_REACHED",
    ErrorCode.UNAUTHORIZED: "SESSION_ERROR",
    ErrorCode.FORBIDDEN: "SESSION_ERROR",
    ErrorCode.MISDIRECTED: "SESSION_ERROR",
    ErrorCode.NOT_FOUND: "SESSION_ERROR",
    ErrorCode.SESSION_NOT_FOUND: "SESSION_ERROR",
    ErrorCode.SESSION_EXISTS: "SESSION_ERROR",
    ErrorCode.EPISODE_DONE: "SESSION_ERROR",
    ErrorCode.SESSION_BUSY: "SESSION_ERROR",
    ErrorCode.STORE_UNAVAILABLE: "SESSION_ERROR",
    ErrorCode.INTERNAL: "EXECUTION_ERROR",
}
"""The OpenEnv code of each vistarl error code; the error answer carries both (`OpenEnvError`)."""


class OpenEnvMessage(_Strict):
    """A client's message on `/ws`: `type` is `reset`, `step`, `state`, `mcp` or `close`; `data` is a
    reset's `OpenEnvReset`, a step's `OpenEnvAction` or an `mcp` message's `JsonRpcRequest`. Send it with
    `exclude_defaults=True`: OpenEnv's own server refuses a `state` or `close` message with any `data`."""

    model_config = _BUILT_AT_FIRST_USE

    type: str
    data: dict[str, Any] = Field(default_factory=dict)


class OpenEnvReset(ResetRequest):
    """A `reset` message's data: `ResetRequest`'s task fields, with OpenEnv's `episode_id` as the session
    id to choose (`session_id` is not taken here)."""

    model_config = _BUILT_AT_FIRST_USE

    session_id: str | None = Field(default=None, min_length=1, max_length=128, validation_alias="episode_id")


class OpenEnvAction(_Strict):
    """A `step` message's data, the action: the response text as `action`, or a `tool_call` of the env's
    tools instead; `request_id` as `/step` takes it; `metadata` is OpenEnv's `Action` field, not used."""

    model_config = _BUILT_AT_FIRST_USE

    action: str | None = None
    tool_call: ToolCall | None = None
    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenEnvObservation(Observation):
    """An observation in OpenEnv's shape: vistarl's own (`text`, `images` as PNG data URLs, `metadata`) with
    the turn's `truncated`, `info` and, after a reset with `format`, the chat `message`. On `/ws` its `done`
    and `reward` travel beside the other fields, as OpenEnv serializes an observation."""

    model_config = _BUILT_AT_FIRST_USE

    done: bool = False
    reward: float | None = None
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    message: Message | None = None

    def result(self) -> OpenEnvResult:
        """This observation as the data of an `observation` answer."""
        fields = self.model_dump(mode="json", exclude={"done", "reward"}, exclude_none=True)
        return OpenEnvResult(observation=fields, reward=self.reward, done=self.done)


class OpenEnvResult(BaseModel):
    """An `observation` answer's data, as every OpenEnv server sends it: the observation's own fields, the
    turn's reward (none at a reset) and whether the episode is done."""

    model_config = _BUILT_AT_FIRST_USE

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False


class OpenEnvState(BaseModel):
    """A `state` answer's data: OpenEnv's `State` (`episode_id`: the vistarl session id; `step_count`)
    and whether the episode is done."""

    model_config = _BUILT_AT_FIRST_USE

    episode_id: str | None = None
    step_count: int = 0
    done: bool = False


class OpenEnvError(BaseModel):
    """An `error` answer's data: OpenEnv's `message` and `code`, and vistarl's own `error_code` (the code
    `/reset` or `/step` would answer over HTTP)."""

    model_config = _BUILT_AT_FIRST_USE

    message: str
    code: OpenEnvErrorCode
    error_code: str | None = None


class OpenEnvReply(BaseModel):
    """A server's answer on `/ws`: `observation`, `state`, `mcp` (a `JsonRpcResponse`) or `error`, with its
    data."""

    model_config = _BUILT_AT_FIRST_USE

    type: Literal["observation", "state", "mcp", "error"]
    data: dict[str, Any]


class OpenEnvSchema(BaseModel):
    """`GET /schema`: the JSON schemas of the action, the observation and the state."""

    model_config = _BUILT_AT_FIRST_USE

    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


class OpenEnvMetadata(BaseModel):
    """`GET /metadata`: OpenEnv's `EnvironmentMetadata`."""

    model_config = _BUILT_AT_FIRST_USE

    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


# --- JSON-RPC 2.0: OpenEnv's `mcp` message on /ws, and /mcp's answer to a body that is no message ------

JSONRPC_PARSE_ERROR = -32700
"""The body is not JSON."""
JSONRPC_INVALID_REQUEST = -32600
"""The JSON is not a JSON-RPC request (or, on `/mcp`, not a JSON-RPC message of any kind)."""
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602
"""A method's params that do not fit it: on `/ws`, a tool call the env's tools do not allow."""
JSONRPC_SERVER_ERROR = -32000
"""Any other error a call meets (its `data.error_code` is the vistarl code HTTP would answer)."""


class JsonRpcRequest(BaseModel):
    """A JSON-RPC 2.0 request, the data of an `mcp` message on `/ws` (OpenEnv's `JsonRpcRequest`)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: int | str | None = None


class JsonRpcError(BaseModel):
    """The `error` member of a JSON-RPC answer: its code, a message, and what more the server says."""

    model_config = _BUILT_AT_FIRST_USE

    code: int
    message: str
    data: dict[str, Any] | None = None


class JsonRpcResponse(BaseModel):
    """A JSON-RPC 2.0 answer: `result` or `error`, never both (`wire` leaves out the other), under the
    request's `id` (null when the request could not be read)."""

    model_config = _BUILT_AT_FIRST_USE

    jsonrpc: Literal["2.0"] = "2.0"
    id: int | str | None = None
    result: Any = None
    error: JsonRpcError | None = None

    @classmethod
    def failure(
        cls, code: int, message: str, request_id: int | str | None = None, **data: Any
    ) -> JsonRpcResponse:
        """An error answer; `data`, when given, becomes the error's data."""
        return cls(id=request_id, error=JsonRpcError(code=code, message=message, data=data or None))

    def wire(self) -> dict[str, Any]:
        """The answer as JSON-RPC has it: `jsonrpc`, `id`, then `error` (no null `data`) or `result`."""
        answer: dict[str, Any] = {"jsonrpc": self.jsonrpc, "id": self.id}
        if self.error is not None:
            answer["error"] = self.error.model_dump(mode="json", exclude_none=True)
        else:
            answer["result"] = self.result
        return answer
