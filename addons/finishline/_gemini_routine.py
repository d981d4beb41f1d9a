"""Which Gemini chunks are routine, for the fast path (`_routine_chunks.SPECS[Dialect.GEMINI]`).

A routine Gemini chunk is one the rules (`_gemini.GeminiRules.on_event`) read for nothing but
whether its text is empty and its `usageMetadata` counts: one candidate, still open (no
`finishReason`, or a null one as translating gateways write), with one part holding a `text` (a
thought summary's too, `"thought": true`) and no `functionCall`, no `promptFeedback`, no error. AI
Studio's chunks are that, but for the last (shared/notes/gemini.md §2):

    data: {"candidates": [{"content": {"parts": [{"text": "Hel"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 9,"totalTokenCount": 13},"modelVersion": "gemini-2.5-flash","responseId": "IZI2"}

The text is the shape's gap, and every integer of `usageMetadata` a count gap of its own (they
change on every chunk); `modelVersion`, `responseId` and the rest are literal. The Code Assist form
(`{"response": {…}, "traceId": …}`, the Gemini CLI's Google login) is read through its wrapping, as
the rules read it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gemini_facts", "gemini_text_part", "gemini_usage"]


def _chunk(event: dict[str, Any]) -> Any:
    """The chunk in a parsed Gemini event: the event, or what Code Assist wraps (the rules' test)."""
    return event["response"] if type(event.get("response")) is dict and "candidates" not in event else event


def gemini_facts(event: Any) -> tuple[int, str, str | None] | None:
    """(the candidate's index, the text key, no free key) for a routine chunk (module docstring),
    else None."""
    if type(event) is not dict or "error" in event:  # (any `error` key makes it the rules' error, G4)
        return None
    chunk = _chunk(event)
    candidates = chunk.get("candidates")
    if "promptFeedback" in chunk or type(candidates) is not list or len(candidates) != 1 or type(candidates[0]) is not dict:
        return None
    candidate = candidates[0]
    index = candidate.get("index", 0)
    content = candidate.get("content")
    if type(index) is not int or candidate.get("finishReason") is not None or type(content) is not dict:
        return None
    parts = content.get("parts")
    if type(parts) is not list or len(parts) != 1 or type(parts[0]) is not dict:
        return None
    # A `functionCall` is a token whatever the text: never routine.
    if type(parts[0].get("text")) is not str or "functionCall" in parts[0]:
        return None
    usage = chunk.get("usageMetadata")
    if usage is not None and type(usage) is not dict:
        return None
    return index, "text", None


def gemini_text_part(event: dict[str, Any]) -> Any:
    """The part that holds a routine chunk's `text`."""
    return _chunk(event)["candidates"][0]["content"]["parts"][0]


def gemini_usage(event: dict[str, Any]) -> dict[str, Any]:
    """The object whose integers are a chunk's counts: its `usageMetadata` (empty: none)."""
    usage = _chunk(event).get("usageMetadata")
    return usage if type(usage) is dict else {}
