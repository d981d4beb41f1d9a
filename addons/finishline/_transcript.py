"""A readable account of a chat-completion event stream: each event on one line, then the answer
reassembled per choice. Backs finish_fix's mitmweb content view; plain text, no mitmproxy."""

from __future__ import annotations

import json

from ._json import UNREADABLE, json_or_unreadable
from ._sse import EventFramer

__all__ = ["looks_like_chat_stream", "transcribe_chat_stream"]


def looks_like_chat_stream(data: bytes) -> bool:
    head = data[:4096]
    return b"data:" in head and (b"chat.completion.chunk" in head or b'"choices"' in head or b"[DONE]" in head)


def transcribe_chat_stream(data: bytes) -> str:
    """Returns the transcript. Never raises on bad input: unreadable events are shown as they are."""
    framer = EventFramer()
    events = framer.receive_data(data)
    leftover = framer.receive_end()
    lines: list[str] = []
    answers: dict[int, dict[str, list[str] | str | None]] = {}
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
            summary = _summarize(event.data, answers)
        except Exception as error:  # a view must show something, whatever the upstream sent
            summary = f"(unreadable event: {type(error).__name__})"
        lines.append(f"{number:>5} {kind}{summary}{marker}")
    lines.append("")
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


def _summarize(data: bytes, answers: dict) -> str:
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
        answer = answers.setdefault(
            index, {"content": [], "reasoning": [], "tool_calls": [], "finish_reason": None}
        )
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        for key, bucket in (("content", "content"), ("reasoning_content", "reasoning"), ("reasoning", "reasoning")):
            if isinstance(delta.get(key), str) and delta[key]:
                answer[bucket].append(delta[key])
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
