"""The registry: which rules read a stream of each dialect, and which dialect an event belongs to.

Every dialect's rules are a class of the shape `_rule_interface.DialectRules`, made once per stream
from the stream's `StreamServices`. The machine (`_repair.StreamRepair`) finds them here and
nowhere else: it imports this table, never a rules module, and the rules modules import neither.

A stream whose first event belongs to another dialect than its path's is not repaired
(`event_dialect` says which it is).
"""

from __future__ import annotations

from collections.abc import Callable

from ._chat import ChatRules
from ._dialect import Dialect
from ._gemini import GeminiRules
from ._json_array import GeminiFramer
from ._messages import EVENT_TYPES as MESSAGES_EVENT_TYPES
from ._messages import MessagesRules
from ._responses import ResponsesRules
from ._rule_interface import DialectRules, StreamServices
from ._sse import EventFramer

__all__ = ["DIALECT_FRAMERS", "DIALECT_RULES", "event_dialect"]

#: The rules of each dialect (`StreamRepair(dialect=...)` makes one of these per stream).
DIALECT_RULES: dict[Dialect, Callable[[StreamServices], DialectRules]] = {
    Dialect.CHAT: ChatRules,
    Dialect.MESSAGES: MessagesRules,
    Dialect.RESPONSES: ResponsesRules,
    Dialect.GEMINI: GeminiRules,
}
# The framers of the dialects not framed as SSE alone (the others: `EventFramer`): Gemini is SSE or
# one JSON array (`_json_array`), whichever the stream's first byte shows.
DIALECT_FRAMERS: dict[Dialect, type[EventFramer]] = {Dialect.GEMINI: GeminiFramer}


def event_dialect(message: object, kind: str | None) -> Dialect | None:
    """The dialect an event's parsed data and type show, or None when it could be any (not JSON,
    an `error`, an unknown type)."""
    if not isinstance(message, dict):
        return None
    if "choices" in message or message.get("object") == "chat.completion.chunk":
        return Dialect.CHAT
    if "candidates" in message or "promptFeedback" in message:
        return Dialect.GEMINI
    if not isinstance(kind, str) or kind == "error":
        return None
    if kind.startswith("response."):
        return Dialect.RESPONSES
    if kind in MESSAGES_EVENT_TYPES:
        return Dialect.MESSAGES
    return None
