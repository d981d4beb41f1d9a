"""Which rules read a stream of each dialect, and which dialect an event belongs to.

Every dialect's rules are a class of the same shape (`_chat.ChatRules`, `_messages.MessagesRules`,
`_responses.ResponsesRules`, `_gemini.GeminiRules`), one instance per stream, read by the one machine
(`_repair.StreamRepair`) through `DIALECT_RULES`:

* `read(event)` -> (type, parsed data); `keepalives`: the types that are no event (M6);
* `on_event(event, type, data)` -> the bytes to send for it (noting tokens, the terminator, an
  upstream error through the machine);
* `on_routine(match)` -> what a fast-path piece did (`DECLINE`, `NOT_STEADY`, `MAY_STEADY`);
* `finished()`, `terminator(how)`: a clean end that only lacks its terminator (rules C4, M3);
* `cut_frames(message)`, `stop_frames()`, `may_stop`: what a cut sends (rules C6, M4, R3);
* `release_held()`: an event held back for a later one (Chat's finish before its usage chunk, rule
  C11), sent as it came when the stream ends or is given up before that;
* `closing_books()`: what the report says about the whole stream at its end.

A stream whose first event belongs to another dialect than its path's is not repaired
(`event_dialect` says which it is).
"""

from __future__ import annotations

from ._chat import ChatRules
from ._dialect import Dialect
from ._gemini import GeminiRules
from ._json_array import GeminiFramer
from ._messages import EVENT_TYPES as MESSAGES_EVENT_TYPES
from ._messages import MessagesRules
from ._responses import ResponsesRules
from ._sse import EventFramer

__all__ = ["DIALECT_FRAMERS", "DIALECT_RULES", "event_dialect"]

DIALECT_RULES: dict[Dialect, type[ChatRules] | type[MessagesRules] | type[ResponsesRules] | type[GeminiRules]] = {
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
