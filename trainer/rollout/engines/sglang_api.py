"""The subset of SGLang's native HTTP API (0.5.x) that vistarl speaks, as pydantic models, defined once.

`SGLangEngine` builds its request bodies from these models and parses the answers with them; the
`vistarl engine serve` app validates incoming bodies and writes its answers with the same models, so
the client and the stand-in server cannot drift apart. Names follow SGLang exactly (`max_new_tokens`,
never OpenAI's `max_tokens`). Request models forbid unknown fields, as SGLang 0.5.23 rejects unknown
`sampling_params` keys with 400; response models accept extra fields, which real SGLang adds.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

FinishType = Literal["stop", "length", "abort"]
PauseMode = Literal["abort", "retract", "in_place"]
TOP_K_ALL = -1
SERVER_KEEP_ALIVE_S = 5
"""How long a server keeps an idle connection open: SGLang's, and `vistarl engine serve`'s (uvicorn's)."""


def _strings(value: str | list[str] | None) -> list[str]:
    """A field that SGLang takes as one string or a list of them (or leaves unset), as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


class _Request(BaseModel):
    """Base of request bodies: an unknown field is an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """Base of response bodies: SGLang may add fields; the ones vistarl reads are typed."""

    model_config = ConfigDict(extra="allow")


class SamplingParams(_Request):
    """SGLang's `sampling_params`, the names vistarl uses. `temperature` 0 means greedy decoding."""

    max_new_tokens: int = Field(default=128, ge=1, description="SGLang's default is 128: always set it.")
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=TOP_K_ALL, description="-1 keeps the whole vocabulary.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, description="Stop strings; `text` is cut before them.")
    stop_token_ids: list[int] | None = Field(default=None, description="Extra stop ids besides EOS.")
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = Field(default=None, description="Seed of this request's sampler.")

    @model_validator(mode="after")
    def _top_k_range(self) -> SamplingParams:
        """SGLang accepts top_k = -1 (disabled) or >= 1."""
        if self.top_k != TOP_K_ALL and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}")
        return self

    @property
    def greedy(self) -> bool:
        """Whether decoding takes the argmax (SGLang treats temperature below 1e-6 as greedy)."""
        return self.temperature < 1e-6

    @property
    def stop_strings(self) -> list[str]:
        """`stop` as a list."""
        return _strings(self.stop)


class FinishReason(BaseModel):
    """Why generation ended: `stop` (with the `matched` id or string), `length`, or `abort` (with `message`).

    Serialized like SGLang's: keys that do not apply are left out rather than sent as null.
    """

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class GenerateBody(_Request):
    """`POST /generate`: exactly one of `text` / `input_ids`, images in pad order, and the sampling params."""

    text: str | None = None
    input_ids: list[int] | None = None
    image_data: list[str] | str | None = Field(default=None, description="Data URLs or bare base64.")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    rid: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        """SGLang takes the prompt as text or as token ids, never both."""
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text or input_ids")
        return self

    @property
    def images(self) -> list[str]:
        """`image_data` as a list."""
        return _strings(self.image_data)


class MetaInfo(_Response):
    """`meta_info` of a `/generate` answer."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reason: FinishReason
    output_token_logprobs: list[tuple[float, int, str | None]] | None = Field(
        default=None, description="[logprob, token_id, text] per output id; present with return_logprob."
    )
    weight_version: str | None = None


class GenerateResponse(_Response):
    """The answer of `POST /generate`. `output_ids` and the logprobs include a matched stop token."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class AbortBody(_Request):
    """`POST /abort_request`: abort one request by `rid`, or every request."""

    rid: str = ""
    abort_all: bool = False


class PauseGenerationBody(_Request):
    """`POST /pause_generation`: `abort` ends in-flight requests; `retract` / `in_place` keep them."""

    mode: PauseMode = "abort"


class UpdateWeightsFromDiskBody(_Request):
    """`POST /update_weights_from_disk`: load an HF-format checkpoint directory."""

    model_path: str = Field(min_length=1)
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False


class InitWeightsUpdateGroupBody(_Request):
    """`POST /init_weights_update_group`: join the trainer's process group for weight broadcasts."""

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=0)
    world_size: int = Field(ge=1)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedBody(_Request):
    """`POST /update_weights_from_distributed`: receive one bucket of tensors broadcast by trainer rank 0."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None

    @model_validator(mode="after")
    def _aligned(self) -> UpdateWeightsFromDistributedBody:
        """One dtype and one shape per tensor name."""
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"names, dtypes and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtypes)}, {len(self.shapes)}"
            )
        return self


class UpdateWeightsResponse(_Response):
    """The answer of the weight-update endpoints."""

    success: bool
    message: str = ""
    num_paused_requests: int | None = None


class ModelInfo(_Response):
    """The answer of `GET /model_info`."""

    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None
