"""Where each dialect's request body says what the worker reads from it (`WorkerSettings.for_request`).

One row per dialect: the keys that limit the output, the `tool_choice` values that force a tool
call, and whether `n` asks for several choices (Messages, Responses and Gemini have no choices).
Gemini nests both: `generationConfig.maxOutputTokens` and `toolConfig.functionCallingConfig.mode`
(a dotted key is a path), its tools are `tools[].functionDeclarations`, its conversation `contents`
with the assistant's role `model`. Its model and stream flag are in the path, not the body
(`gemini_request_body`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from finishline import Dialect

__all__ = ["REQUEST_READINGS", "RequestReading", "gemini_json_array", "gemini_request_body"]


#: What `_at` gives for a key the body does not have (None is a value a body may send).
_MISSING = object()


def _at(body: Mapping[str, Any], key: str) -> Any:
    """`body[key]`, a dotted key a path into nested objects; `_MISSING` when any step is missing."""
    value: Any = body
    for step in key.split("."):
        if not isinstance(value, Mapping) or step not in value:
            return _MISSING
        value = value[step]
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestReading:
    """What one dialect's request body says, and where."""

    #: The body keys that limit the output, first present wins.
    max_tokens_keys: tuple[str, ...]
    #: `tool_choice` strings that force a call.
    forcing_strings: frozenset[str]
    #: `tool_choice.type` values that force a call (an object naming one tool, or any).
    forcing_types: frozenset[str]
    #: Whether the body's `n` asks for several choices.
    has_choices: bool
    #: The body key that holds the conversation (`messages`; Responses' `input`; Gemini's `contents`).
    conversation_key: str = "messages"
    #: The key (a dotted path) of the tool choice (`tool_choice`; Gemini's calling mode).
    tool_choice_key: str = "tool_choice"
    #: The role of the assistant's messages (`assistant`; Gemini's `model`).
    assistant_role: str = "assistant"

    def requested_max(self, body: Mapping[str, Any]) -> Any:
        """The output limit the body asks for: the value of the first of `max_tokens_keys` present
        (whatever it is), None when none is."""
        return next((value for key in self.max_tokens_keys if (value := _at(body, key)) is not _MISSING), None)

    def forces_tool_call(self, body: Mapping[str, Any]) -> bool:
        """Whether the body declares tools and its `tool_choice` says one must be called."""
        choice = _at(body, self.tool_choice_key)
        forced = (isinstance(choice, str) and choice in self.forcing_strings) or (
            isinstance(choice, Mapping) and choice.get("type") in self.forcing_types
        )
        return forced and isinstance(body.get("tools"), list) and bool(body["tools"])

    def ends_with_assistant(self, body: Mapping[str, Any]) -> bool:
        """Whether the conversation's last message is the assistant's: a partial answer the
        request asks the model to continue ("prefill"; a gateway's mid-stream fallback sends one).
        A Responses `input` that is a string is a user message."""
        conversation = body.get(self.conversation_key)
        if not isinstance(conversation, list) or not conversation:
            return False
        last = conversation[-1]
        return isinstance(last, Mapping) and last.get("role") == self.assistant_role


REQUEST_READINGS: dict[Dialect, RequestReading] = {
    # OpenAI Chat: "required" means one or more calls; `{"type": "function", ...}` names the one.
    Dialect.CHAT: RequestReading(
        max_tokens_keys=("max_completion_tokens", "max_tokens"),
        forcing_strings=frozenset({"required"}),
        forcing_types=frozenset({"function"}),
        has_choices=True,
    ),
    # Anthropic: `{"type": "any"}` must use some tool, `{"type": "tool", "name": ...}` that one.
    Dialect.MESSAGES: RequestReading(
        max_tokens_keys=("max_tokens",),
        forcing_strings=frozenset(),
        forcing_types=frozenset({"any", "tool"}),
        has_choices=False,
    ),
    # OpenAI Responses: the same words as Chat; the limit is `max_output_tokens`.
    Dialect.RESPONSES: RequestReading(
        max_tokens_keys=("max_output_tokens",),
        forcing_strings=frozenset({"required"}),
        forcing_types=frozenset({"function"}),
        has_choices=False,
        conversation_key="input",
    ),
    # Gemini: `toolConfig.functionCallingConfig.mode` `ANY` must call some function (with
    # `allowedFunctionNames`, one of those); the limit is `generationConfig.maxOutputTokens`.
    # (`candidateCount` asks for several candidates; the worker answers with candidate 0 only.)
    Dialect.GEMINI: RequestReading(
        max_tokens_keys=("generationConfig.maxOutputTokens",),
        forcing_strings=frozenset({"ANY"}),
        forcing_types=frozenset(),
        has_choices=False,
        conversation_key="contents",
        tool_choice_key="toolConfig.functionCallingConfig.mode",
        assistant_role="model",
    ),
}

#: `…/models/{model}:streamGenerateContent` or `:generateContent`, any prefix before `models/`.
_GEMINI_ACTIONS = (":streamGenerateContent", ":generateContent")


def gemini_request_body(target: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A Gemini request's body as the worker reads every dialect's: with the `model` its path names
    (URL-decoded: a client may escape the settings' `;` and `=`) and `stream` true for
    `:streamGenerateContent` (Gemini's body has neither). `target` is the request target, query
    included. A body that names its own `model` keeps it (none does)."""
    path = target.split("?", 1)[0].rstrip("/")
    action = next((end for end in _GEMINI_ACTIONS if path.endswith(end)), None)
    read = dict(body)
    if action is None:
        return read
    name = path[: -len(action)]
    model = unquote(name.rsplit("/models/", 1)[1] if "/models/" in name else name.rsplit("/", 1)[-1])
    read.setdefault("model", model)
    read["stream"] = action == ":streamGenerateContent"
    return read


def gemini_json_array(target: str) -> bool:
    """Whether a Gemini stream request asks for the JSON-array form: no `alt=sse` in its query."""
    _, _, query = target.partition("?")
    return "alt=sse" not in query.split("&")
