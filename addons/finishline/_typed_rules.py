"""What the rules of the two dialects whose events name their type (Messages, Responses) share.

Their events are `event: <type>` frames whose data repeats the type; the rules read the type from
the data (else from the `event:` field, for data that is not JSON or has none), and their fast-path
pieces (`_routine_chunks`) are text deltas that change nothing but whether a token came.
"""

from __future__ import annotations

from typing import Any

from ._json import json_or_unreadable
from ._routine_chunks import MAY_STEADY, RoutineMatch
from ._rule_interface import StreamServices
from ._sse import Event

__all__ = ["TypedEventRules"]


class TypedEventRules:
    """The base of `MessagesRules` and `ResponsesRules` (`_rule_interface.DialectRules` is the
    shape of rules)."""

    keepalives: frozenset[str] = frozenset()

    def __init__(self, stream: StreamServices) -> None:
        self._stream = stream

    @staticmethod
    def read(event: Event) -> tuple[str | None, Any]:
        """(the event's type, its parsed data)."""
        message = json_or_unreadable(event.data)
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str):
            kind = event.event_type.decode("utf-8", "replace") if event.event_type else None
        return kind, message

    def on_routine(self, match: RoutineMatch) -> int:
        """The fast path matched a routine text delta (a token if its text is not empty, which the
        machine notes): another of its shape changes nothing but the counts."""
        return MAY_STEADY

    def note_sequence_number(self, number: int) -> None:
        """Only Responses numbers its events."""

    def release_held(self) -> bytes:
        """These dialects hold no event back (only Chat's rule C11 does)."""
        return b""

    def closing_books(self) -> None:
        """Nothing about the whole stream is booked at its end (unless a dialect says otherwise)."""
