"""Stall deadlines: when an upstream that went silent counts as stalled.

Two deadlines run while a stream is being repaired (`RepairPolicy`, seconds, 0 = off):

* first token: one `first_token_timeout` after the request went upstream, until the first token
  (content, reasoning, a refusal or a tool call: a role-only chunk is an event but no token). It
  counts from the request, not from the response head, so that a head that never comes is caught
  too (`head_deadline`: then there is no stream yet, and the caller answers the client itself,
  `_no_head`); a head that comes does not restart it.
* idle: one `idle_timeout` after the last event. Events are what a client dispatches (a block with a
  `data` field); comments and keep-alive lines never move it, so a gateway's `: keep-alive` cannot
  hide a dead worker. It starts with the first token while the first-token deadline is on: a
  server that sends its role chunk at once and then thinks silently for minutes is what the long
  first-token deadline is for, and the idle one must not cut it first. With the first-token
  deadline off it starts with the first event.

Pure functions of the policy and of times the caller gave: the core has no clock, and the caller
sets its own timer for `next_check`.
"""

from __future__ import annotations

from typing import NamedTuple

from ._verdict import RepairPolicy
from ._wording import stall_reason

__all__ = ["Deadline", "StallDeadlines", "earliest_deadline", "head_deadline", "next_check"]


class Deadline(NamedTuple):
    # When the stream counts as stalled if nothing moves it first (the caller's clock).
    at: float
    # True for the first-token deadline, False for the idle one (the words differ).
    first_token: bool
    # The timeout it came from, in seconds.
    timeout: float


def _idle_running(policy: RepairPolicy, *, last_event_at: float | None, first_token_seen: bool) -> bool:
    """The idle deadline runs from the first event, or from the first token while the first-token
    deadline is on (until then that one governs)."""
    if last_event_at is None:
        return False
    return first_token_seen or policy.first_token_timeout <= 0


def earliest_deadline(
    policy: RepairPolicy, *, sent_at: float | None, last_event_at: float | None, first_token_seen: bool
) -> Deadline | None:
    """The earliest deadline now running, or None when neither runs."""
    deadline = None
    if (
        policy.idle_timeout > 0
        and last_event_at is not None  # (`_idle_running` says so too; this tells the type checker)
        and _idle_running(policy, last_event_at=last_event_at, first_token_seen=first_token_seen)
    ):
        deadline = Deadline(last_event_at + policy.idle_timeout, False, policy.idle_timeout)
    if policy.first_token_timeout > 0 and not first_token_seen and sent_at is not None:
        first_token = Deadline(sent_at + policy.first_token_timeout, True, policy.first_token_timeout)
        if deadline is None or first_token.at < deadline.at:
            deadline = first_token
    return deadline


def head_deadline(policy: RepairPolicy, *, sent_at: float) -> float | None:
    """When a request sent upstream at `sent_at` counts as unanswered if no response head came by
    then (the first-token deadline, before there is a stream), or None when that deadline is off."""
    return sent_at + policy.first_token_timeout if policy.first_token_timeout > 0 else None


def next_check(
    policy: RepairPolicy, *, sent_at: float | None, last_event_at: float | None, first_token_seen: bool, now: float
) -> float | None:
    """When the caller should look again, or None for never. Deadlines only move later as events
    come, except that the idle deadline starts (with the first event, or the first token) without
    the caller seeing it, and may then be earlier than the first-token one: until it runs the caller
    looks again at least every idle timeout (so a stall is still caught within one idle timeout of
    the deadline)."""
    deadline = earliest_deadline(policy, sent_at=sent_at, last_event_at=last_event_at, first_token_seen=first_token_seen)
    if policy.idle_timeout > 0 and not _idle_running(policy, last_event_at=last_event_at, first_token_seen=first_token_seen):
        look_again = now + policy.idle_timeout
        return look_again if deadline is None else min(deadline.at, look_again)
    return None if deadline is None else deadline.at


class StallDeadlines:
    """One stream's deadlines: its policy and when its request went upstream. The machine passes in
    what moves them (the time of the last event, whether the first token came) on every question."""

    __slots__ = ("_policy", "_sent_at")

    def __init__(self, policy: RepairPolicy, *, sent_at: float | None) -> None:
        self._policy = policy
        self._sent_at = sent_at

    def next_check(self, last_event_at: float | None, first_token_seen: bool, *, now: float) -> float | None:
        """When the caller should look again (`next_check`), or None for never."""
        return next_check(
            self._policy, sent_at=self._sent_at, last_event_at=last_event_at, first_token_seen=first_token_seen, now=now
        )

    def maybe_stalled(self, last_event_at: float | None, first_token_seen: bool, *, events: int, now: float) -> str | None:
        """Why the stream counts as stalled at `now` (which deadline passed, after how many
        `events`), or None while no running deadline has passed."""
        deadline = earliest_deadline(
            self._policy, sent_at=self._sent_at, last_event_at=last_event_at, first_token_seen=first_token_seen
        )
        if deadline is None or now < deadline.at:
            return None
        return stall_reason(first_token=deadline.first_token, timeout=deadline.timeout, events=events)
