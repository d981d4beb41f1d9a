"""Stall deadlines: when an upstream that went silent counts as stalled.

Two deadlines run while a stream is being repaired (`RepairPolicy`, seconds, 0 = off):

* idle: one `idle_timeout` after the last event, once the first event arrived. Events are what a
  client dispatches (a block with a `data` field); comments and keep-alive lines never move it, so a
  gateway's `: keep-alive` cannot hide a dead worker.
* first token: one `first_token_timeout` after the response head, until the first token (content,
  reasoning, a refusal or a tool call: a role-only chunk is an event but no token).

Pure functions of the policy and of times the caller gave: the core has no clock, and the caller
sets its own timer for `next_check`.
"""

from __future__ import annotations

from typing import NamedTuple

from ._verdict import RepairPolicy

__all__ = ["Deadline", "earliest_deadline", "next_check"]


class Deadline(NamedTuple):
    # When the stream counts as stalled if nothing moves it first (the caller's clock).
    at: float
    # True for the first-token deadline, False for the idle one (the words differ).
    first_token: bool
    # The timeout it came from, in seconds.
    timeout: float


def earliest_deadline(
    policy: RepairPolicy, *, head_at: float | None, last_event_at: float | None, first_token_seen: bool
) -> Deadline | None:
    """The earliest deadline now running, or None when neither runs."""
    deadline = None
    if policy.idle_timeout > 0 and last_event_at is not None:
        deadline = Deadline(last_event_at + policy.idle_timeout, False, policy.idle_timeout)
    if policy.first_token_timeout > 0 and not first_token_seen and head_at is not None:
        first_token = Deadline(head_at + policy.first_token_timeout, True, policy.first_token_timeout)
        if deadline is None or first_token.at < deadline.at:
            deadline = first_token
    return deadline


def next_check(policy: RepairPolicy, deadline: Deadline | None, *, before_first_event: bool, now: float) -> float | None:
    """When the caller should look again, or None for never. Deadlines only move later as events
    come, except that the first event starts the idle deadline, which may then be earlier than the
    first-token one: until then the caller looks again at least every idle timeout (so a stall is
    still caught exactly one idle timeout after the last event)."""
    if before_first_event and policy.idle_timeout > 0:
        look_again = now + policy.idle_timeout
        return look_again if deadline is None else min(deadline.at, look_again)
    return None if deadline is None else deadline.at
