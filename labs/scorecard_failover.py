"""The scorecard's failover columns (labs.scorecard): the rules that grade the failover benchmark's
scenarios from a cell's outcome and its attempts' evidence (labs.evidence).

Failoverbench's words (shared/notes/failover-suites.md): `pass` (rescued, every check clean),
`partial` (rescued, an advisory check failed), `safe` (not rescued, a bounded clean error), `fail` (a
required check failed, a hang, a truncated answer presented as success). The required checks here:
no tight loop (`MOST_ATTEMPTS_PER_S`), no retried 400, no prefill 400 as the final error, no hang or
truncation; the advisory ones: a backoff before a retry at the same server (`LEAST_BACKOFF_S`), a
circuit that opens and closes, the fallback's model and usage reaching the caller. docs/lab.md ("The
scorecard") has the table.

`Score` and the attempt facts (`first_hop`, `first_gap`) come from labs.scorecard_words, shared with
labs.scorecard.
"""

from __future__ import annotations

import re
from typing import Any

from labs.evidence import max_attempts_per_s
from labs.outcome import Outcome
from labs.scorecard_words import Score, first_gap, first_hop

__all__ = [
    "LEAST_BACKOFF_S",
    "MOST_ATTEMPTS_PER_S",
    "answered_by_spare",
    "tries_words",
    "backs_off_on_429",
    "circuit_opens",
    "fails_over_on_503",
    "fallback_model_and_usage",
    "healthy_afterwards",
    "no_prefill_400_after_cut",
    "no_retry_of_content_policy",
]


#: Hammering: more attempts than this within one second (`max_attempts_per_s`) is a tight loop.
#: Every SDK's backoff (0.5 s, then 1 s) stays under it, and so does LiteLLM's three tries at the
#: primary then one at the spare (its retries with another deployment in the group do not wait:
#: the first gap says so, `partial`); 5 attempts 50 ms, 75 ms ... apart (SMG's, vllm-router's) do not.
MOST_ATTEMPTS_PER_S = 4
#: A backoff: the least first gap that counts as waiting before a retry at the same server.
LEAST_BACKOFF_S = 0.2
#: The error text of the prefill 400 (labs.worker.answer.PREFILL_MESSAGE, lower case).
_PREFILL_400 = "prefill is not supported"
#: Words that carry a content-policy refusal's reason to the caller, in each dialect's body.
_CONTENT_POLICY_WORDS = ("content_policy_violation", "safety system", "content filtering policy")


def _attempt_words(cell: dict[str, Any]) -> str:
    """`N tries, first gap X s, most Y in 1 s`: the attempts' evidence, for a column's why."""
    gap = first_gap(cell)
    return (
        f"{tries_words(cell.get('tries'))}, first gap "
        + (f"{gap:.2f} s" if gap is not None else "none")
        + f", most {_hammering(cell)} in 1 s"
    )


def tries_words(tries: int | None) -> str:
    """`1 try`, `3 tries`, `? tries` (none recorded)."""
    return "1 try" if tries == 1 else f"{tries if tries is not None else '?'} tries"


def _hammering(cell: dict[str, Any]) -> int:
    if "max_attempts_per_s" in cell:
        return int(cell["max_attempts_per_s"] or 0)
    return max_attempts_per_s([a["arrived_at"] for a in first_hop(cell)])


def _bounded(outcome: Outcome) -> bool:
    """A clean, bounded failure: the client was told (an exception or a failure reason)."""
    return outcome in (Outcome.ERROR, Outcome.FLAGGED)


def backs_off_on_429(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A 429 on every attempt at the primary, no Retry-After (S02): never a tight loop (more than
    `MOST_ATTEMPTS_PER_S` in a second: `fail`), never a hang; the spare's answer after a backoff is
    `pass`, without one (a first gap under `LEAST_BACKOFF_S` at the same server) `partial`; a clean
    error after backing off is `safe`."""
    outcome = cell["outcome"]
    words = f"{outcome.value}, {_attempt_words(cell)}"
    if outcome in (Outcome.HANG, Outcome.SILENT_TRUNCATION) or _hammering(cell) > MOST_ATTEMPTS_PER_S:
        return Score.FAIL, words
    if _bounded(outcome):
        return Score.SAFE, words
    attempts = first_hop(cell)
    gap = first_gap(cell)
    same_server = len(attempts) >= 2 and attempts[0].get("at") == attempts[1].get("at")
    if same_server and gap is not None and gap < LEAST_BACKOFF_S:
        return Score.PARTIAL, words + " (retried without backing off)"
    return Score.PASS, words


def answered_by_spare(cell: dict[str, Any]) -> bool:
    return cell.get("answered_by") == "spare" or bool((cell.get("worker_requests") or {}).get("spare"))


def fails_over_on_503(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A 503 on every attempt at the primary, a healthy spare (S04): the spare's answer is `pass`
    (`partial` if the primary was hammered first); the error surfaced within a bounded number of
    tries is `safe`; a hang, a silent truncation or a tight loop is `fail`."""
    outcome = cell["outcome"]
    words = f"{outcome.value}, {_attempt_words(cell)}"
    if outcome in (Outcome.HANG, Outcome.SILENT_TRUNCATION):
        return Score.FAIL, words
    if _bounded(outcome):
        return (Score.FAIL if _hammering(cell) > MOST_ATTEMPTS_PER_S else Score.SAFE), words
    if not answered_by_spare(cell):
        return Score.FAIL, words + ", but the spare never saw it (an answer from a failing primary?)"
    if _hammering(cell) > MOST_ATTEMPTS_PER_S:
        return Score.PARTIAL, words + ", the spare answered after a tight loop"
    return Score.PASS, words + ", the spare answered"


def _error_text(cell: dict[str, Any]) -> str:
    report = cell.get("report") or {}
    return f"{report.get('error_class') or ''}: {report.get('error_message') or ''}".lower()


def no_retry_of_content_policy(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A 400 content-policy refusal on every attempt (S13): one try and an error that carries the
    reason is `pass`; one try and an error without it, or a failure reason, `safe`; a retry (at
    either worker) or the refusal hidden (`ok`, a truncation, a hang) is `fail`."""
    outcome = cell["outcome"]
    tries = cell.get("tries")
    if outcome in (Outcome.OK, Outcome.SILENT_TRUNCATION, Outcome.HANG):
        return Score.FAIL, f"{outcome.value} after {tries if tries is not None else '?'} tries"
    if tries is not None and tries > 1:
        return Score.FAIL, f"{outcome.value}, but the 400 was sent {tries} times"
    if outcome is Outcome.ERROR and any(word in _error_text(cell) for word in _CONTENT_POLICY_WORDS):
        return Score.PASS, "error naming the content policy, 1 try"
    return Score.SAFE, f"{outcome.value}, 1 try, the reason not in what the client raised"


def no_prefill_400_after_cut(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A cut after tokens, and a spare that rejects assistant prefill (S14): the final error must
    never be the prefill 400. A whole answer is `pass`; an error that is not the prefill 400 (the
    cut named) `safe`; the prefill 400 as the client's error, a truncation or a hang `fail`."""
    outcome = cell["outcome"]
    if outcome is Outcome.OK:
        return Score.PASS, f"ok, {_attempt_words(cell)}"
    if outcome in (Outcome.SILENT_TRUNCATION, Outcome.HANG):
        return Score.FAIL, outcome.value
    if _PREFILL_400 in _error_text(cell):
        return Score.FAIL, f"{outcome.value}: the client's error is the prefill 400"
    return Score.SAFE, f"{outcome.value}, not the prefill 400"


def circuit_opens(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A primary that fails a cell's first attempts then recovers, over a run of requests (S15):
    every request answered, some sent straight to the spare (an attempt at the spare that no
    failed primary attempt came just before: the circuit open), and the last one back at the
    primary is `pass`; every request answered but no circuit, or never back, `partial`; some
    requests failed cleanly `safe`; a hang or a truncation `fail`."""
    outcome = cell["outcome"]
    attempts = first_hop(cell)
    straight_to_spare = sum(
        1
        for before, attempt in zip([None, *attempts], attempts)
        if attempt.get("at") == "spare" and not _failed_at_primary(before)
    )
    back = bool(attempts) and attempts[-1].get("at") != "spare" and attempts[-1].get("ended") == "complete"
    words = f"{outcome.value}; {len(attempts)} attempts, {straight_to_spare} straight to the spare, last at {attempts[-1].get('at') if attempts else 'none'}"
    if outcome in (Outcome.HANG, Outcome.SILENT_TRUNCATION):
        return Score.FAIL, words
    if _bounded(outcome):
        return Score.SAFE, words
    if straight_to_spare and back:
        return Score.PASS, words
    return Score.PARTIAL, words + (
        " (no circuit: every request tried the primary first)" if not straight_to_spare else " (never back at the primary)"
    )


def _failed_at_primary(attempt: dict[str, Any] | None) -> bool:
    """An attempt at the primary that did not end `complete` (a 503, a reset ...)."""
    return attempt is not None and attempt.get("at") != "spare" and attempt.get("ended") != "complete"


def fallback_model_and_usage(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """The primary 503s, the spare answers as another model with its own usage (S16): the spare's
    answer with its `model` and its usage reaching the client is `pass`; the spare's answer with
    the primary's name (the requested model) or without usage `partial`; the error surfaced `safe`;
    a hang or a truncation `fail`. The model and usage are what the client reported (`report.model`,
    `report.usage`), where its driver reports them."""
    outcome = cell["outcome"]
    if outcome in (Outcome.HANG, Outcome.SILENT_TRUNCATION):
        return Score.FAIL, outcome.value
    if _bounded(outcome):
        return Score.SAFE, f"{outcome.value}, {_attempt_words(cell)}"
    report = cell.get("report") or {}
    model, usage = report.get("model"), report.get("usage")
    wanted_model = _worker_setting(scenario, "spare_model")
    wanted_prompt = _worker_setting(scenario, "spare_prompt_tokens")
    seen_prompt = usage.get("prompt_tokens", usage.get("input_tokens")) if isinstance(usage, dict) else None
    words = f"ok, model {model!r}, prompt tokens {seen_prompt!r}"
    if model is None and usage is None:
        return Score.PASS if answered_by_spare(
            cell
        ) else Score.PARTIAL, words + " (the client reports neither; the spare answered)"
    if model == wanted_model and wanted_prompt is not None and seen_prompt == int(wanted_prompt):
        return Score.PASS, words
    return Score.PARTIAL, words + f" (the spare's: {wanted_model!r}, {wanted_prompt})"


def _worker_setting(scenario: dict[str, Any], name: str) -> str | None:
    """One setting from the scenario entry's worker header (`key=value; ...`), None if absent."""
    found = re.search(rf"(?:^|;)\s*{name}=([^;]+)", scenario.get("worker") or "")
    return found.group(1).strip() if found else None


def healthy_afterwards(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """The probe after the cell (labs.evidence): `ok` is `pass`, anything else `fail`."""
    probe = cell.get("probe") or {}
    if probe.get("ok"):
        return Score.PASS, f"probe ok after {cell['outcome']}"
    return Score.FAIL, f"probe {probe.get('outcome')} after {cell['outcome']}: {probe.get('why')}"
