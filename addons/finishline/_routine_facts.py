"""Which events are routine, per dialect: the ones the fast path (`_routine_chunks`) may learn a shape
from and match, because the rules read nothing of them but whether their text is empty (and their
counts, Gemini's). Each function gives (the index, the key holding the text, a free key or None) for
a routine event, else None (`_routine_chunks.RoutineSpec.facts`).

Gemini's: one candidate, still open (no `finishReason`, or a null one as translating gateways
write), with one part holding a `text` (a thought summary's too) and no `functionCall`, no
`promptFeedback`, no error. AI Studio's chunks are that, but for the last (shared/notes/gemini.md §2):

    data: {"candidates": [{"content": {"parts": [{"text": "Hel"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 9,"totalTokenCount": 13},"modelVersion": "gemini-2.5-flash","responseId": "IZI2"}

The text is the shape's gap, and each token count of `usageMetadata` (`COUNT_KEYS`) a count gap of its own (they
change on every chunk); `modelVersion`, `responseId` and the rest are literal. The Code Assist form
(`{"response": {…}, "traceId": …}`, the Gemini CLI's Google login) is read through its wrapping, as
the rules read it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "COUNT_KEYS",
    "FREE_TOP_LEVEL_KEYS",
    "MESSAGES_TEXT_KEYS",
    "NUMBER_KEY",
    "TEXT_DELTA_KEYS",
    "chat_facts",
    "gemini_facts",
    "gemini_text_part",
    "gemini_usage",
    "messages_facts",
    "responses_facts",
]

# Delta keys whose string value is the model's text. One of them is the gap; every other delta key
# of a routine chunk must be falsy (so nothing else makes it a "token"), except `role`.
TEXT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "refusal")
# Top-level keys whose string value may change on every chunk and that the repair never reads.
# OpenAI pads every stream chunk with a random `obfuscation` string (stream_options.include_obfuscation).
FREE_TOP_LEVEL_KEYS = ("obfuscation",)
# The integers of a Gemini chunk's `usageMetadata` that are its shape's count gaps: its token
# counts (another integer is a literal of the shape).
COUNT_KEYS = frozenset(
    {
        "promptTokenCount",
        "candidatesTokenCount",
        "totalTokenCount",
        "thoughtsTokenCount",
        "cachedContentTokenCount",
        "toolUsePromptTokenCount",
    }
)
# A Responses delta's number, which changes on every event.
NUMBER_KEY = "sequence_number"

# The text keys of the Messages and Responses routine events.
MESSAGES_TEXT_KEYS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
_RESPONSES_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
    }
)

# Those of them that name their content part by `content_index` (`_responses.CONTENT_INDEXED_EVENTS`).
_CONTENT_INDEXED = frozenset({"response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta"})


def chat_facts(chunk: Any) -> tuple[int, str, str | None] | None:
    """(choice index, the text key, the free top-level key or None) if the full path's handling of
    `chunk` depends on nothing but whether its text is empty; else None."""
    if type(chunk) is not dict or chunk.get("error") is not None or isinstance(chunk.get("usage"), dict):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    choice = choices[0]
    index = choice.get("index", 0)
    if type(index) is not int or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict:
        return None
    text_key = next((key for key in TEXT_DELTA_KEYS if type(delta.get(key)) is str), None)
    if text_key is None:
        return None
    if any(value for key, value in delta.items() if key != text_key and key != "role"):
        return None
    free_key = next((key for key in FREE_TOP_LEVEL_KEYS if type(chunk.get(key)) is str), None)
    return index, text_key, free_key


def messages_facts(event: Any) -> tuple[int, str, str | None] | None:
    """A Messages `content_block_delta` of text, thinking or tool input, and nothing else."""
    if type(event) is not dict or event.get("type") != "content_block_delta" or len(event) != 3:
        return None
    delta = event.get("delta")
    if type(delta) is not dict or len(delta) != 2 or type(event.get("index")) is not int:
        return None
    delta_type = delta.get("type")  # looked up only if a string: a list or object is unhashable
    text_key = MESSAGES_TEXT_KEYS.get(delta_type) if type(delta_type) is str else None
    if text_key is None or type(delta.get(text_key)) is not str:
        return None
    return 0, text_key, None


def responses_facts(event: Any) -> tuple[int, str, str | None] | None:
    """A Responses text, reasoning, refusal or arguments delta with its sequence number."""
    if type(event) is not dict or type(event.get("type")) is not str or event.get("error") is not None:
        return None
    if event["type"] not in _RESPONSES_TEXT_EVENTS:  # (after the check above: a list is unhashable)
        return None
    if type(event.get("delta")) is not str or type(event.get(NUMBER_KEY)) is not int or event[NUMBER_KEY] < 0:
        return None
    # An event without its indexes is one rule R7 may fill in: never a shape the fast path passes as it came.
    if type(event.get("output_index")) is not int or (
        event["type"] in _CONTENT_INDEXED and type(event.get("content_index")) is not int
    ):
        return None
    free_key = next((key for key in FREE_TOP_LEVEL_KEYS if type(event.get(key)) is str), None)
    return 0, "delta", free_key


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
    """The object holding a chunk's counts (`COUNT_KEYS`): its `usageMetadata` (empty: none)."""
    usage = _chunk(event).get("usageMetadata")
    return usage if type(usage) is dict else {}
