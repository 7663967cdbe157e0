"""Tool calls as actions: a `/step` with a `tool_call` of one of the env's `tools` steps with the response
text the call stands for (`EnvFactory.tool_call_text`), so a chat-completion agent passes the model's
tool calls through unchanged (docs/agents.md).

A call naming no tool of the env (nor one of its `tool_aliases`), whose arguments are not a JSON object
valid against the tool's parameter schema, or whose text would pass the server's `max_action_chars`, is
a 422 `validation_error` naming what is wrong; nothing steps.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from vistarl.clients.protocol import ErrorCode, JSONObject, StepRequest, ToolCall
from vistarl.httpserver.errors import ServiceError
from vistarl.services.env_api import EnvFactory

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator


class ToolActions:
    """Turns the calls of one env's tools (by their names or `tool_aliases`) into its response text,
    checking them against the schemas and the server's action length limit."""

    def __init__(self, factory: EnvFactory, max_action_chars: int | None = None) -> None:
        self.factory = factory
        self.max_action_chars = max_action_chars
        self.schemas = {
            tool["function"]["name"]: tool["function"].get("parameters", {}) for tool in factory.tools
        }
        self.schemas.update({alias: self.schemas[name] for alias, name in factory.tool_aliases.items()})

    @functools.cached_property
    def validators(self) -> dict[str, Draft202012Validator]:
        """A validator of each tool's parameter schema, by name and alias, built on the first tool call:
        a server start does not import jsonschema."""
        from jsonschema import Draft202012Validator

        return {name: Draft202012Validator(schema) for name, schema in self.schemas.items()}

    def resolve(self, request: StepRequest) -> StepRequest:
        """`request` with the text of its tool call as the action; unchanged when it has none."""
        if request.tool_call is None:
            return request
        action = self.action(request.tool_call)
        if self.max_action_chars is not None and len(action) > self.max_action_chars:
            raise _invalid(
                f"tool_call: its arguments make a response of {len(action)} characters; the limit "
                f"(max_action_chars) is {self.max_action_chars}"
            )
        return request.model_copy(update={"action": action, "tool_call": None})

    def action(self, call: ToolCall) -> str:
        """The response text of `call`, or a 422 naming the unknown tool or the bad argument."""
        validator = self.validators.get(call.name)
        if validator is None:
            known = ", ".join(self.validators) or "none"
            raise _invalid(f"tool_call.name: {self.factory.name} has no tool {call.name!r} (tools: {known})")
        arguments = _arguments(call)
        errors = sorted(validator.iter_errors(arguments), key=lambda error: list(error.absolute_path))
        if errors:
            raise _invalid("; ".join(_describe(error.absolute_path, error.message) for error in errors))
        try:
            return self.factory.tool_call_text(call.name, arguments)
        except ValueError as exc:
            raise _invalid(f"tool_call: {exc}") from None


def _arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as an object: given as one, or as its JSON text (an empty text is `{}`), read
    by the body's own parser and held to the same rules (`vistarl.clients.protocol.JSONObject`)."""
    if isinstance(call.arguments, dict):
        return call.arguments
    try:
        return _OBJECT.validate_json(call.arguments or "{}")
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        reason = {"json_invalid": "not JSON", "dict_type": "expected a JSON object"}.get(error["type"], "")
        message = str(error["msg"]).removeprefix("Value error, ")
        raise _invalid(f"tool_call.arguments: {f'{reason} ({message})' if reason else message}") from None


_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(JSONObject)


def _describe(path: Any, message: str) -> str:
    """One schema error, located under `tool_call.arguments`."""
    return ".".join(["tool_call.arguments", *(str(part) for part in path)]) + f": {message}"


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.VALIDATION_ERROR, message)
