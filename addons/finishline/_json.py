"""Reading JSON that an upstream sent: never an exception, whatever the bytes."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["UNREADABLE", "json_or_unreadable", "plural"]

UNREADABLE: Any = object()
"""What `json_or_unreadable` returns for bytes that are not JSON (a sentinel: JSON `null` is None)."""


def json_or_unreadable(data: bytes | str | None) -> Any:
    """The parsed value, or UNREADABLE for invalid JSON, invalid UTF-8, or nesting too deep for the
    parser (json raises RecursionError there, which is not a ValueError)."""
    if data is None:
        return UNREADABLE
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return UNREADABLE


def plural(count: int, noun: str) -> str:
    """'1 event', '12 events'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
