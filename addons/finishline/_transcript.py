"""A readable account of an event stream in any of the four dialects: each event on one line, then
the answer reassembled per choice (Chat), per content block (Messages), per output item
(Responses) or per candidate (Gemini, in either stream form). Backs finish_fix's mitmweb content
view; plain text, no mitmproxy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypedDict

from ._dialect import Dialect
from ._json import UNREADABLE, json_or_unreadable
from ._json_array import GeminiFramer
from ._sse import EventFramer

__all__ = ["looks_like_chat_stream", "stream_dialect", "transcribe_chat_stream", "transcribe_stream"]


class _ChoiceAnswer(TypedDict):
    """What a Chat choice said, reassembled from its deltas."""

    content: list[str]
    reasoning: list[str]
    tool_calls: list[str]
    finish_reason: object  # the last non-null finish_reason, whatever JSON value it was


class _BlockAnswer(TypedDict):
    """What a Messages content block or a Responses output item said."""

    label: str
    text: list[str]


def looks_like_chat_stream(data: bytes) -> bool:
    head = data[:4096]
    return b"data:" in head and (b"chat.completion.chunk" in head or b'"choices"' in head or b"[DONE]" in head)


def stream_dialect(data: bytes) -> Dialect | None:
    """The dialect the start of an event stream (or of Gemini's JSON-array stream) shows, or None
    when it shows none of the four."""
    head = data[:4096]
    gemini = Dialect.GEMINI if b'"candidates"' in head or b'"promptFeedback"' in head else None
    if b"data:" not in head:
        return gemini if head.lstrip()[:1] == b"[" else None
    if b"message_start" in head and (
        b"event: message_start" in head or b'"type":"message_start"' in head or b'"type": "message_start"' in head
    ):
        return Dialect.MESSAGES
    if b"event: response." in head or b'"type":"response.' in head or b'"type": "response.' in head:
        return Dialect.RESPONSES
    return Dialect.CHAT if looks_like_chat_stream(data) else gemini


def transcribe_stream(data: bytes, dialect: Dialect) -> str:
    """The transcript of a stream in `dialect`. Never raises on bad input."""
    if dialect is Dialect.CHAT:
        return transcribe_chat_stream(data)
    # Keyed by the event's `index` or `output_index`, whatever JSON value the upstream sent there.
    answers: dict[object, _BlockAnswer] = {}
    summarize = _SUMMARIZERS[dialect]
    framer = GeminiFramer() if dialect is Dialect.GEMINI else EventFramer()
    lines = _numbered_events(data, lambda event_data: summarize(event_data, answers), framer)
    if not answers:
        lines.append("(no content)")
    for key in sorted(answers, key=lambda key: (not isinstance(key, int), key if isinstance(key, int) else 0, str(key))):
        answer = answers[key]
        lines.append(f"--- {answer['label']}")
        lines.append("".join(answer["text"]))
    return "\n".join(lines)


def _numbered_events(data: bytes, summarize: Callable[[bytes], str], framer: EventFramer | None = None) -> list[str]:
    """One line per event (comments shown, numbered data events, each summarized from its data),
    then a blank line."""
    framer = framer or EventFramer()
    events = framer.receive_data(data)
    leftover = framer.receive_end()
    lines: list[str] = []
    number = 0
    for event in events + ([leftover] if leftover is not None else []):
        if event.data is None:
            text = event.raw.decode("utf-8", "replace").strip()
            if text.startswith(":"):
                lines.append(f"      {text}")
            continue
        number += 1
        marker = "" if event.complete else "  (incomplete: the stream ended inside this event)"
        kind = f"[{event.event_type.decode('utf-8', 'replace')}] " if event.event_type else ""
        try:
            summary = summarize(event.data)
        except Exception as error:  # a view must show something, whatever the upstream sent
            summary = f"(unreadable event: {type(error).__name__})"
        lines.append(f"{number:>5} {kind}{summary}{marker}")
    lines.append("")
    return lines


def transcribe_chat_stream(data: bytes) -> str:
    """Returns the transcript. Never raises on bad input: unreadable events are shown as they are."""
    answers: dict[int, _ChoiceAnswer] = {}
    lines = _numbered_events(data, lambda event_data: _summarize(event_data, answers))
    if not answers:
        lines.append("(no choices)")
    for index in sorted(answers):
        answer = answers[index]
        lines.append(f"--- choice {index}: finish_reason={answer['finish_reason']!r}")
        if answer["reasoning"]:
            lines.append("reasoning: " + "".join(answer["reasoning"]))
        if answer["tool_calls"]:
            lines.append("tool calls: " + "".join(answer["tool_calls"]))
        lines.append("content: " + "".join(answer["content"]))
    return "\n".join(lines)


def _summarize(data: bytes, answers: dict[int, _ChoiceAnswer]) -> str:
    if data.startswith(b"[DONE]"):
        return "[DONE]"
    chunk = json_or_unreadable(data)
    if chunk is UNREADABLE:
        return "not JSON: " + data[:200].decode("utf-8", "replace")
    if not isinstance(chunk, dict):
        return data[:200].decode("utf-8", "replace")
    if chunk.get("error") is not None:
        return "ERROR " + json.dumps(chunk["error"], ensure_ascii=False)[:300]
    parts = []
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        if not isinstance(index, int):
            continue
        answer = answers.setdefault(index, {"content": [], "reasoning": [], "tool_calls": [], "finish_reason": None})
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        for key, bucket in (
            ("content", answer["content"]),
            ("reasoning_content", answer["reasoning"]),
            ("reasoning", answer["reasoning"]),
        ):
            if isinstance(delta.get(key), str) and delta[key]:
                bucket.append(delta[key])
                parts.append(f"#{index} {key}={delta[key]!r}")
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            function = function if isinstance(function, dict) else {}
            piece = str(function.get("name") or "") + str(function.get("arguments") or "")
            answer["tool_calls"].append(piece)
            parts.append(f"#{index} tool_call={piece!r}")
        reason = choice.get("finish_reason")
        if reason is not None:
            answer["finish_reason"] = reason
            parts.append(f"#{index} finish_reason={reason!r}")
    if isinstance(chunk.get("usage"), dict):
        parts.append("usage=" + json.dumps(chunk["usage"])[:200])
    return ", ".join(parts) or "(no deltas)"


# Messages: the text of each delta type, and how a block is labelled.
_MESSAGES_DELTA_TEXT = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def _summarize_messages(data: bytes, blocks: dict[object, _BlockAnswer]) -> str:
    event = json_or_unreadable(data)
    if event is UNREADABLE:
        return "not JSON: " + data[:200].decode("utf-8", "replace")
    if not isinstance(event, dict):
        return data[:200].decode("utf-8", "replace")
    kind = event.get("type")
    if kind == "error":
        return "ERROR " + json.dumps(event.get("error"), ensure_ascii=False)[:300]
    index = event.get("index")
    if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
        block = event["content_block"]
        name = f" {block['name']}" if isinstance(block.get("name"), str) else ""
        blocks[index] = {"label": f"block {index}: {block.get('type')}{name}", "text": []}
        return f"#{index} start {block.get('type')}{name}"
    if kind == "content_block_delta" and isinstance(event.get("delta"), dict):
        delta = event["delta"]
        delta_type = delta.get("type")
        key = _MESSAGES_DELTA_TEXT.get(delta_type) if isinstance(delta_type, str) else None
        piece = delta.get(key) if key else None
        if isinstance(piece, str):
            blocks.setdefault(index, {"label": f"block {index}", "text": []})["text"].append(piece)
            return f"#{index} {key}={piece!r}"
        return f"#{index} {delta.get('type')}"
    if kind == "message_delta":
        delta = event.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        return f"stop_reason={delta.get('stop_reason')!r}, usage=" + json.dumps(event.get("usage"))[:200]
    return str(kind)


def _summarize_responses(data: bytes, items: dict[object, _BlockAnswer]) -> str:
    event = json_or_unreadable(data)
    if event is UNREADABLE or data.startswith(b"[DONE]"):
        return "[DONE]" if data.startswith(b"[DONE]") else "not JSON: " + data[:200].decode("utf-8", "replace")
    if not isinstance(event, dict):
        return data[:200].decode("utf-8", "replace")
    kind = event.get("type")
    number = event.get("sequence_number")
    prefix = f"seq {number} " if isinstance(number, int) else ""
    if kind is None and event.get("error") is not None or kind == "error":
        return prefix + "ERROR " + json.dumps(event.get("error") or event, ensure_ascii=False)[:300]
    if kind == "response.output_item.added" and isinstance(event.get("item"), dict):
        item = event["item"]
        name = f" {item['name']}" if isinstance(item.get("name"), str) else ""
        items[event.get("output_index")] = {"label": f"item {event.get('output_index')}: {item.get('type')}{name}", "text": []}
        return f"{prefix}{kind} {item.get('type')}{name}"
    if isinstance(kind, str) and kind.endswith(".delta") and isinstance(event.get("delta"), str):
        index = event.get("output_index")
        items.setdefault(index, {"label": f"item {index}", "text": []})["text"].append(event["delta"])
        return f"{prefix}{kind} {event['delta']!r}"
    response = event.get("response")
    if isinstance(response, dict):
        return f"{prefix}{kind} status={response.get('status')!r}"
    return f"{prefix}{kind}"


def _summarize_gemini(data: bytes, candidates: dict[object, _BlockAnswer]) -> str:
    if data == b"]":
        return "] (the array's end)"
    message = json_or_unreadable(data)
    if message is UNREADABLE:
        return "not JSON: " + data[:200].decode("utf-8", "replace")
    if not isinstance(message, dict):
        return data[:200].decode("utf-8", "replace")
    if "error" in message:
        return "ERROR " + json.dumps(message["error"], ensure_ascii=False)[:300]
    # Code Assist (the Gemini CLI's Google login) wraps each chunk in `response`.
    chunk = message["response"] if isinstance(message.get("response"), dict) and "candidates" not in message else message
    said: list[str] = []
    feedback = chunk.get("promptFeedback")
    if isinstance(feedback, dict) and feedback.get("blockReason"):
        said.append(f"blocked: {feedback['blockReason']!r}")
    found = chunk.get("candidates")
    for position, candidate in enumerate(found if isinstance(found, list) else []):
        if not isinstance(candidate, dict):
            continue
        index = candidate.get("index", position)
        answer = candidates.setdefault(index, {"label": f"candidate {index}", "text": []})
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                answer["text"].append(part["text"])
                said.append(f"#{index} {'thought' if part.get('thought') else 'text'}={part['text']!r}")
            elif isinstance(part.get("functionCall"), dict):
                call = json.dumps(part["functionCall"], ensure_ascii=False)[:300]
                answer["text"].append(f"[functionCall {call}]")
                said.append(f"#{index} functionCall {call}")
        if "finishReason" in candidate:
            answer["label"] = f"candidate {index}: finishReason={candidate['finishReason']!r}"
            said.append(f"#{index} finishReason={candidate['finishReason']!r}")
    usage = chunk.get("usageMetadata")
    if isinstance(usage, dict):
        said.append("usage=" + json.dumps(usage)[:200])
    return ", ".join(said) or "(no candidates)"


_SUMMARIZERS: dict[Dialect, Callable[[bytes, dict[object, _BlockAnswer]], str]] = {
    Dialect.MESSAGES: _summarize_messages,
    Dialect.RESPONSES: _summarize_responses,
    Dialect.GEMINI: _summarize_gemini,
}
