"""A minimal OpenAI-compatible chat completion on top of an engine's `generate`, for agents (docs/agents.md).

`ChatCompletionRequest` is the subset `vistarl engine serve` answers at `POST /v1/chat/completions`: the
messages (text and `image_url` parts whose URLs are base64 data URLs), optional function `tools`, and
the sampling fields below; no streaming, one choice. The messages and tools are rendered with the
checkpoint's own chat template (a template that knows no tools, such as Qwen2.5-VL's, leaves them out),
generated from, and the reply's `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks (the
form Qwen's templates teach) come back as OpenAI `tool_calls` when the request had tools.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vistarl.services.env_api import TOOL_CALL_BLOCK
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import image_urls

DEFAULT_MAX_TOKENS = 256
ChatFinish = Literal["stop", "length", "tool_calls"]


class ChatCompletionRequest(BaseModel):
    """The request fields this server reads; any other field is an error naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="Ignored: the server has one checkpoint.")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: Literal[1] = 1
    stream: Literal[False] = False

    def sampling(self) -> SamplingParams:
        """The engine's sampling params; the reply keeps special tokens, so `<tool_call>` survives."""
        return SamplingParams(
            max_new_tokens=self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            sampling_seed=self.seed,
            skip_special_tokens=False,
        )

    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools the template shows the model: none with `tool_choice: "none"`."""
        return None if self.tool_choice == "none" else self.tools


class FunctionCall(BaseModel):
    name: str
    arguments: str
    """The arguments as JSON text, as OpenAI sends them."""


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: ChatFinish


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


def generate_request(processor: VLProcessor, body: ChatCompletionRequest) -> GenerateRequest:
    """The engine request of a chat: the template's render of the messages (and tools), with the
    generation prompt, as single-pad ids, and the messages' images in order. A ValueError names a bad
    message."""
    messages = [_for_template(message, index) for index, message in enumerate(body.messages)]
    text = processor.tokenizer.apply_chat_template(
        messages, tools=body.offered_tools(), tokenize=False, add_generation_prompt=True
    )
    ids = list(processor.tokenizer.encode(str(text), add_special_tokens=False))
    images = [url for message in messages for url in image_urls(message)]
    return GenerateRequest(engine_ids=ids, images=images, sampling=body.sampling())


def completion(result: GenerateResult, model: str, with_tools: bool) -> ChatCompletion:
    """The OpenAI answer of a generation; with tools offered, its `<tool_call>` blocks are `tool_calls`."""
    content: str | None = result.text
    calls = parse_tool_calls(result.text) if with_tools else []
    if calls:
        content = TOOL_CALL_BLOCK.sub("", result.text).strip() or None
    finish: ChatFinish = (
        "tool_calls" if calls else ("length" if result.finish_reason.type == "length" else "stop")
    )
    return ChatCompletion(
        id=f"chatcmpl-{result.rid}",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(message=AssistantMessage(content=content, tool_calls=calls or None), finish_reason=finish)
        ],
        usage=Usage(
            prompt_tokens=result.prompt_tokens,
            completion_tokens=len(result.output_ids),
            total_tokens=result.prompt_tokens + len(result.output_ids),
        ),
    )


def parse_tool_calls(text: str) -> list[ToolCallOut]:
    """The `<tool_call>` blocks of a reply that hold a JSON object with a string `name`, in order."""
    calls = []
    for block in TOOL_CALL_BLOCK.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
            function = FunctionCall(name=call["name"], arguments=encoded)
            calls.append(ToolCallOut(id=f"call_{uuid.uuid4().hex[:24]}", function=function))
    return calls


def _for_template(message: dict[str, Any], index: int) -> dict[str, Any]:
    """A message as chat templates take it: a known role, content text or parts (a None content, as
    OpenAI sends with tool calls, is empty text), image parts with data URLs."""
    where = f"messages.{index}"
    if message.get("role") not in ("system", "user", "assistant", "tool"):
        raise ValueError(
            f"{where}.role: expected system, user, assistant or tool, got {message.get('role')!r}"
        )
    content = message.get("content")
    if content is None:
        return {**message, "content": ""}
    if isinstance(content, list):
        for number, part in enumerate(content):
            _check_part(part, f"{where}.content.{number}")
    elif not isinstance(content, str):
        raise ValueError(f"{where}.content: expected text or a list of parts")
    return message


def _check_part(part: Any, where: str) -> None:
    """A content part is text, or an image given as a base64 data URL (this server fetches nothing)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return
    if kind == "image_url":
        url = (part.get("image_url") or {}).get("url", "")
        if isinstance(url, str) and url.startswith("data:image/"):
            return
        raise ValueError(f"{where}.image_url.url: expected a data:image/...;base64 URL")
    raise ValueError(f"{where}: expected a text or an image_url part")
