"""What the rules of the two dialects whose events name their type (Messages, Responses) share.

Their events are `event: <type>` frames whose data repeats the type; the rules read the type from
the data (else from the `event:` field, for data that is not JSON or has none), and their fast-path
pieces (`_routine_chunks`) are text deltas that change nothing but whether a token came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._json import json_or_unreadable
from ._routine_chunks import MAY_STEADY
from ._sse import Event

if TYPE_CHECKING:  # the machine that drives these rules (it imports them)
    from ._repair import StreamRepair
    from ._routine_chunks import RoutineMatch

__all__ = ["TypedEventRules"]


class TypedEventRules:
    """The base of `MessagesRules` and `ResponsesRules` (see `_rules` for the shape of rules)."""

    keepalives: frozenset[str] = frozenset()

    def __init__(self, machine: StreamRepair) -> None:
        self._machine = machine

    @staticmethod
    def read(event: Event) -> tuple[str | None, Any]:
        """(the event's type, its parsed data)."""
        message = json_or_unreadable(event.data)
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str):
            kind = event.event_type.decode("utf-8", "replace") if event.event_type else None
        return kind, message

    def on_routine(self, match: RoutineMatch) -> int:
        """The fast path matched a routine text delta: a token if its text is not empty."""
        if match.has_text:
            self._machine._first_token_seen = True
        return MAY_STEADY

    def release_held(self) -> bytes:
        """These dialects hold no event back (only Chat's rule C11 does)."""
        return b""

    def closing_books(self) -> None:
        """Nothing about the whole stream is booked at its end (unless a dialect says otherwise)."""
