"""Evidence per cell beyond its outcome: how its attempts were spaced, and a healthy probe after it.

A failover suite's machine checks (shared/notes/failover-suites.md) read the attempt log: the gap
between the first and the second attempt (a `Retry-After` honoured, a backoff), and the most
attempts within any one-second window (no hammering). And one check reads what comes after the
fault: a healthy call through the same system succeeds, so a fault that wedges a gateway (a
circuit that never closes, a pool of dead connections, a worker thread still held) shows.

- `first_gap_s`: seconds from the first attempt's arrival to the second's; None with fewer than two.
- `max_attempts_per_s`: the most attempts that arrived within one second of each other (a window
  `[t, t + 1)` starting at an attempt); 0 without attempts.
- The probe: after a scenario run's cells are done and its fault is lifted, each library cell's
  client sends one healthy request through the cell's gateway, with the cell's settings (base URL,
  API key, deadline, prompt) but healthy worker settings (`PROBE_SETTINGS`) and its own id
  (`probe_id`: the cell's number after `p`), so its attempts and its books entry are its own,
  never the cell's. A coding agent's cell has no probe (starting its CLI again costs seconds).

The attempts counted are those the gateway (or the client) made: the first server behind the
gateway and the spare (`labs.topology.attach_workers`), not the hub's relays to the primary again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from finishline import Dialect
from labs.clients import DEFAULT_MAX_TOKENS
from labs.outcome import ClientReport, Expected, Judgement, Outcome
from labs.worker.answer import dialect_reason, expected_answer
from labs.worker.settings import WorkerSettings

__all__ = [
    "PROBE_SETTINGS",
    "first_gap_s",
    "max_attempts_per_s",
    "probe_expected",
    "probe_id",
    "probe_json",
    "probe_model_name",
]

#: A probe's worker settings: the worker's healthy defaults, with what the request could change
#: pinned as every scenario pins it (`labs.scenario.load_scenario`): one choice, no usage chunk,
#: a limit above the answer.
PROBE_SETTINGS = WorkerSettings(tokens=8, n=1, include_usage=False, max_tokens=DEFAULT_MAX_TOKENS)


def probe_id(cell_id: str) -> str:
    """The probe's id for a cell's (`c0007` -> `p0007`): as long as a cell id, never one."""
    return "p" + cell_id[1:]


def probe_model_name(cell_id: str) -> str:
    """The model a cell's probe names (before the gateway's route prefix)."""
    return PROBE_SETTINGS.to_model_name(probe_id(cell_id))


def probe_expected(dialect: Dialect) -> Expected:
    """The probe's true answer, its reason in `dialect`'s words."""
    [choice] = expected_answer(PROBE_SETTINGS).choices
    return Expected(text=choice.content, finish_reason=dialect_reason(choice.finish_reason, dialect), dialect=dialect)


def probe_json(probe_cell_id: str, report: ClientReport, judgement: Judgement, tries: int | None = None) -> dict[str, Any]:
    """A cell's `probe` in `result.json`: `ok` (the probe's outcome is `ok`), its outcome and why,
    its id and the attempts it took (`tries`, filled in with the cell's attempts)."""
    return {
        "ok": judgement.outcome is Outcome.OK,
        "outcome": judgement.outcome.value,
        "why": judgement.reason,
        "cell_id": probe_cell_id,
        "tries": tries,
        "total_s": report.duration_s,
    }


def first_gap_s(arrivals: Sequence[float]) -> float | None:
    """Seconds between the first and the second attempt (arrival times, any order), rounded to
    milliseconds; None with fewer than two."""
    if len(arrivals) < 2:
        return None
    first, second = sorted(arrivals)[:2]
    return round(second - first, 3)


def max_attempts_per_s(arrivals: Sequence[float], window_s: float = 1.0) -> int:
    """The most attempts whose arrivals fall within one window `[t, t + window_s)` that starts at
    an attempt (a sliding window: any one second, not clock seconds); 0 without attempts."""
    ordered = sorted(arrivals)
    most, start = 0, 0
    for end, arrived in enumerate(ordered):
        while arrived - ordered[start] >= window_s:
            start += 1
        most = max(most, end - start + 1)
    return most
