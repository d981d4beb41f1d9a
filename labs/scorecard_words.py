"""The scorecard's words and the attempt facts its rules read (labs.scorecard, and its failover
columns in labs.scorecard_failover): one place for both, so neither imports the other's module."""

from __future__ import annotations

import enum
from typing import Any

from labs.evidence import first_gap_s
from labs.topology import HUB

__all__ = ["Score", "first_gap", "first_hop"]


class Score(enum.StrEnum):
    """A scorecard cell's word, best first."""

    PASS = "pass"
    #: Rescued, but an advisory check failed (failoverbench's `partial`).
    PARTIAL = "partial"
    #: No rescue, but a bounded, visible failure where a rescue was possible.
    SAFE = "safe"
    FAIL = "fail"
    #: Nothing in the run to judge by.
    NOT_APPLICABLE = "n/a"


def first_hop(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """The cell's attempts as the gateway made them: the hub's when it has any, else the workers'."""
    attempts = cell.get("attempts") or []
    at_hub = [a for a in attempts if a.get("at") == HUB]
    return at_hub or attempts


def first_gap(cell: dict[str, Any]) -> float | None:
    """The cell's `first_gap_s` (labs.evidence), or for a result from before it, the same from the
    attempts the gateway made."""
    if "first_gap_s" in cell:
        gap = cell["first_gap_s"]
        return float(gap) if gap is not None else None
    return first_gap_s([a["arrived_at"] for a in first_hop(cell)])
