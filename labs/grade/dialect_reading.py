"""What a Messages, Responses or Gemini answer carried, read into the graders' one shape (`ChoiceReading`).

`labs.grade.reading` frames a body and asks the core what each event is (an error, the stream's
terminator, data); this module reads the data events and the whole JSON bodies of the two dialects
for what the server checks ask beyond well-formedness: the text, the reasoning, the tool calls and
the reason the answer ended. Messages and Responses have no choices, so everything goes to choice 0;
Gemini's candidates do, and the graders ask for one: its first candidate (`index` 0) is choice 0.

Per dialect, what "the reason" is (`ChoiceReading.reasons_seen` holds every value that was not null,
`""` included, as for Chat's `finish_reason`):

- Messages: each `message_delta`'s `delta.stop_reason` in a stream, the `message`'s `stop_reason`
  in a JSON body (`end_turn`, `max_tokens`, `tool_use`, ...).
- Responses: the terminal response's `status` (`completed`, `incomplete`; `response.completed` and
  `response.incomplete` carry it), the `response`'s `status` in a JSON body. Which terminal event
  came is the stream's own fact (`StreamReading.terminal_type`).
- Gemini: each chunk's `candidates[0].finishReason`, in a stream and in a JSON body alike (`STOP`,
  `MAX_TOKENS`, ...). `""` and `FINISH_REASON_UNSPECIFIED` both say the model has not stopped (the
  core's rule G3, `GEMINI_NO_REASONS`): both are read as `""`, the defect, never as a reason. A
  `functionCall` part is a whole call (name and `args` at once), its arguments kept as JSON text
  as the other dialects' are; a `thought` part's text is reasoning. The Gemini CLI's Code Assist
  form wraps each chunk (`{"response": {...}, "traceId": ...}`) and is read inside the wrapper.

Pure: dictionaries in, the choice filled in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finishline import GEMINI_NO_REASONS, Dialect
from labs.grade.choice_reading import ChoiceReading

__all__ = ["DIALECT_READINGS", "DialectReading", "event_type", "gemini_chunk", "gemini_first_candidate"]


def event_type(value: Any) -> str | None:
    """An event's type as the core reads it: the data's `type` (both dialects repeat it there)."""
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# -- Anthropic Messages ---------------------------------------------------------------------------

#: `content_block_delta` types -> (where the text goes, the key that holds it).
_MESSAGES_DELTAS = {
    "text_delta": ("content", "text"),
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("arguments", "partial_json"),
}
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})


def _absorb_messages_event(choice: ChoiceReading, value: dict[str, Any]) -> None:
    kind = event_type(value)
    if kind == "content_block_start":
        block = value.get("content_block")
        # `_text` first: a type that is a list or an object is unhashable (a TypeError in a table).
        if isinstance(block, dict) and _text(block.get("type")) in _TOOL_BLOCKS:
            choice.tool_calls.append({"name": _text(block.get("name")), "arguments": ""})
    elif kind == "content_block_delta":
        delta = value.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        where, key = _MESSAGES_DELTAS.get(_text(delta.get("type"))) or (None, None)
        text = _text(delta.get(key)) if key else ""
        if where == "content":
            choice.content += text
        elif where == "reasoning":
            choice.reasoning += text
        elif where == "arguments" and choice.tool_calls:
            choice.tool_calls[-1]["arguments"] += text
    elif kind == "message_delta":
        delta = value.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        if delta.get("stop_reason") is not None:
            choice.reasons_seen.append(str(delta["stop_reason"]))


def _read_message(value: Any, choice: ChoiceReading) -> bool:
    """A JSON `message` into `choice`; False when the body is not one (an error body)."""
    if not isinstance(value, dict) or value.get("type") != "message":
        return False
    for block in value.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            choice.content += _text(block.get("text"))
        elif block.get("type") == "thinking":
            choice.reasoning += _text(block.get("thinking"))
        elif _text(block.get("type")) in _TOOL_BLOCKS:
            # A whole message carries the input parsed; as text it compares with a stream's pieces.
            choice.tool_calls.append({"name": _text(block.get("name")), "arguments": json.dumps(block.get("input"))})
    if value.get("stop_reason") is not None:
        choice.reasons_seen.append(str(value["stop_reason"]))
    return True


# -- OpenAI Responses -----------------------------------------------------------------------------

#: Delta events -> where their `delta` goes.
_RESPONSES_DELTAS = {
    "response.output_text.delta": "content",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.reasoning_text.delta": "reasoning",
    "response.function_call_arguments.delta": "arguments",
}
#: The events whose response's `status` is the reason the answer ended.
_RESPONSES_ENDINGS = frozenset({"response.completed", "response.incomplete"})


def _absorb_responses_event(choice: ChoiceReading, value: dict[str, Any]) -> None:
    kind = event_type(value)
    where = _RESPONSES_DELTAS.get(kind or "")
    if where is not None:
        text = _text(value.get("delta"))
        if where == "content":
            choice.content += text
        elif where == "reasoning":
            choice.reasoning += text
        elif choice.tool_calls:
            choice.tool_calls[-1]["arguments"] += text
    elif kind == "response.output_item.added":
        item = value.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call":
            choice.tool_calls.append({"name": _text(item.get("name")), "arguments": ""})
    elif kind in _RESPONSES_ENDINGS:
        response = value.get("response")
        if isinstance(response, dict) and response.get("status") is not None:
            choice.reasons_seen.append(str(response["status"]))


def _read_response(value: Any, choice: ChoiceReading) -> bool:
    """A JSON `response` into `choice`; False when the body is not one (an error body)."""
    if not isinstance(value, dict) or value.get("object") != "response":
        return False
    for item in value.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            choice.content += "".join(_text(part.get("text")) for part in item.get("content") or () if isinstance(part, dict))
        elif item.get("type") == "reasoning":
            choice.reasoning += "".join(_text(part.get("text")) for part in item.get("summary") or () if isinstance(part, dict))
        elif item.get("type") == "function_call":
            choice.tool_calls.append({"name": _text(item.get("name")), "arguments": _text(item.get("arguments"))})
    if value.get("status") is not None:
        choice.reasons_seen.append(str(value["status"]))
    return True


# -- Google Gemini --------------------------------------------------------------------------------


def gemini_chunk(value: Any) -> dict[str, Any] | None:
    """A `GenerateContentResponse` (a stream's chunk or a whole body), unwrapped from Code Assist's
    `{"response": ...}`; None for anything else (an error object, a list, ...)."""
    if not isinstance(value, dict) or "error" in value:
        return None
    if isinstance(value.get("response"), dict) and "candidates" not in value:
        return value["response"]
    return value


def gemini_first_candidate(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The candidate of `index` 0 (a candidate without an index is its position), or None."""
    candidates = chunk.get("candidates")
    for position, candidate in enumerate(candidates if isinstance(candidates, list) else ()):
        if isinstance(candidate, dict) and candidate.get("index", position) == 0:
            return candidate
    return None


def _absorb_gemini_candidate(choice: ChoiceReading, candidate: dict[str, Any]) -> None:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            choice.tool_calls.append({"name": _text(call.get("name")), "arguments": json.dumps(call.get("args"))})
        elif part.get("thought") is True:
            choice.reasoning += _text(part.get("text"))
        else:
            choice.content += _text(part.get("text"))
    reason = candidate.get("finishReason")
    if reason is not None:
        choice.reasons_seen.append("" if reason in GEMINI_NO_REASONS else str(reason))


def _absorb_gemini_event(choice: ChoiceReading, value: dict[str, Any]) -> None:
    chunk = gemini_chunk(value)
    candidate = gemini_first_candidate(chunk) if chunk is not None else None
    if candidate is not None:
        _absorb_gemini_candidate(choice, candidate)


def _read_gemini_body(value: Any, choice: ChoiceReading) -> bool:
    """A whole `GenerateContentResponse` into `choice`; False when the body is not one (an error
    body, or no `candidates` and no `promptFeedback`)."""
    chunk = gemini_chunk(value)
    if chunk is None or not ("candidates" in chunk or "promptFeedback" in chunk):
        return False
    candidate = gemini_first_candidate(chunk)
    if candidate is not None:
        _absorb_gemini_candidate(choice, candidate)
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class DialectReading:
    """How one dialect's answers are read into choice 0."""

    #: A data event of a stream (a dict) into the choice.
    absorb_event: Callable[[ChoiceReading, dict[str, Any]], None]
    #: A whole JSON body into the choice; False when it is not an answer (an error body).
    read_body: Callable[[Any, ChoiceReading], bool]


DIALECT_READINGS: dict[Dialect, DialectReading] = {
    Dialect.MESSAGES: DialectReading(absorb_event=_absorb_messages_event, read_body=_read_message),
    Dialect.RESPONSES: DialectReading(absorb_event=_absorb_responses_event, read_body=_read_response),
    Dialect.GEMINI: DialectReading(absorb_event=_absorb_gemini_event, read_body=_read_gemini_body),
}
