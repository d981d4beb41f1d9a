"""The scorecard's failover columns (labs/scorecard.py; failoverbench's pass / partial / safe / fail):
each column's rule from synthetic cells, `n/a` for a gateway without a spare where failing over
needs one, and the evidence (first gap, attempts in one second, probe) in SCORECARD.md."""

from __future__ import annotations

import pytest

from labs.scorecard import build_scorecard, render_scorecard_markdown
from labs.scorecard_failover import MOST_ATTEMPTS_PER_S
from tests.test_lab_scorecard import _attempt, _cell

SCENARIOS = [
    {"name": "http-429-persistent", "worker": "primary_429_persistent=1"},
    {"name": "http-503-persistent", "worker": "primary_503_persistent=1"},
    {"name": "http-400-content-policy", "worker": "http_400_content_policy=1", "finish_reason": None},
    {"name": "cut-then-prefill-rejected", "worker": "reject_prefill=1"},
    {"name": "flapping-primary", "worker": "primary_503_first=10"},
    {
        "name": "fallback-model-usage",
        "worker": "primary_503_persistent=1; spare_model=finishline-spare; spare_prompt_tokens=21; include_usage=1",
    },
    {"name": "healthy", "worker": ""},
    {"name": "http-429-retry-after", "worker": "http_429_retry_after=2"},
]


def _scenarios():
    return [
        {
            "name": s["name"],
            "dialect": "chat",
            "title": s["name"],
            "worker": s["worker"],
            "expected": {"text": "The quick", "finish_reason": s.get("finish_reason", "stop"), "tool_calls": []},
        }
        for s in SCENARIOS
    ]


def _score(*cells, gateway="litellm", column):
    card = build_scorecard({"scenarios": _scenarios(), "cells": list(cells), "gateways": [gateway], "versions": {}})
    return card["gateways"][gateway][column]


def cell(scenario, outcome, *, gateway="litellm", at=(), gap=None, per_s=None, error=None, probe=None, **extra):
    """A cell with attempts at the servers `at` names, one second apart unless `gap` says the
    first gap (labs.evidence's fields set from them, or as given)."""
    arrivals = [10.0 + i for i in range(len(at))]
    if gap is not None and len(arrivals) > 1:
        arrivals = [10.0, 10.0 + gap, *[10.0 + gap + i for i in range(1, len(at) - 1)]]
    # `primary:ok` is an answer from the primary; a bare `primary` failed (the flapping 503).
    attempts = [_attempt(server.split(":")[0], arrival) for server, arrival in zip(at, arrivals)]
    for attempt, server in zip(attempts, at):
        attempt["ended"] = "complete" if server == "spare" or server.endswith(":ok") else "http_error:503"
    at = tuple(server.split(":")[0] for server in at)
    made = _cell(scenario, gateway, outcome, attempts=attempts, tries=len(attempts))
    made["first_gap_s"] = round(arrivals[1] - arrivals[0], 3) if len(arrivals) > 1 else None
    made["max_attempts_per_s"] = per_s if per_s is not None else (1 if attempts else 0)
    made["probe"] = probe if probe is not None else {"ok": True, "outcome": "ok", "why": "", "cell_id": "p", "tries": 1}
    made["answered_by"] = "spare" if "spare" in at else "primary" if at else None
    made["worker_requests"] = {server: list(at).count(server) for server in set(at)}
    if error is not None:
        made["report"]["error_class"], made["report"]["error_message"] = error
    made["report"].update(extra)
    return made


@pytest.mark.parametrize(
    ("outcome", "at", "gap", "per_s", "score"),
    [
        # Backed off at the primary, then the spare answered.
        ("ok", ("primary", "primary", "spare"), 0.8, 2, "pass"),
        # Straight to the spare after one 429: a fail-over needs no backoff.
        ("ok", ("primary", "spare"), 0.01, 2, "pass"),
        # Rescued, but the retry at the primary came at once: the advisory backoff check failed.
        ("ok", ("primary", "primary", "spare"), 0.05, 3, "partial"),
        # The SDK's own retries, then a clean error (direct).
        ("error", ("primary", "primary", "primary"), 0.6, 2, "safe"),
        # A tight loop, whatever the outcome.
        ("error", ("primary",) * 5, 0.05, MOST_ATTEMPTS_PER_S + 2, "fail"),
        ("ok", ("primary",) * 5 + ("spare",), 0.05, MOST_ATTEMPTS_PER_S + 2, "fail"),
        ("hang", ("primary",), None, 1, "fail"),
    ],
)
def test_backs_off_on_429(outcome, at, gap, per_s, score):
    entry = _score(cell("http-429-persistent", outcome, at=at, gap=gap, per_s=per_s), column="backs-off-on-429")
    assert entry["score"] == score
    assert "first gap" in entry["evidence"][0]["why"]


@pytest.mark.parametrize(
    ("outcome", "at", "per_s", "score"),
    [
        ("ok", ("primary", "primary", "primary", "spare"), 2, "pass"),
        ("ok", ("primary",) * 5 + ("spare",), MOST_ATTEMPTS_PER_S + 1, "partial"),
        ("error", ("primary", "primary", "primary"), 2, "safe"),
        ("error", ("primary",) * 6, MOST_ATTEMPTS_PER_S + 2, "fail"),
        ("silent-truncation", ("primary",), 1, "fail"),
        # An `ok` the spare never saw cannot be the spare's answer.
        ("ok", ("primary",), 1, "fail"),
    ],
)
def test_fails_over_on_503(outcome, at, per_s, score):
    assert _score(cell("http-503-persistent", outcome, at=at, per_s=per_s), column="fails-over-on-503")["score"] == score


@pytest.mark.parametrize("column", ["fails-over-on-503", "circuit-opens", "fallback-model-and-usage"])
def test_a_gateway_without_a_spare_is_n_a_where_failing_over_needs_one(column):
    scenario = {"fails-over-on-503": "http-503-persistent", "circuit-opens": "flapping-primary"}.get(
        column, "fallback-model-usage"
    )
    entry = _score(cell(scenario, "error", gateway="direct", at=("primary",) * 3), gateway="direct", column=column)
    assert entry["score"] == "n/a" and "no spare" in entry["why"]
    # A gateway the registry does not know has a spare when the spare saw its cells.
    known = _score(cell(scenario, "ok", gateway="mine", at=("primary", "spare")), gateway="mine", column=column)
    assert known["score"] != "n/a"


def test_direct_is_judged_on_backing_off_and_on_the_400s_without_a_spare():
    entry = _score(
        cell("http-429-persistent", "error", gateway="direct", at=("primary",) * 3, gap=0.7, per_s=2),
        gateway="direct",
        column="backs-off-on-429",
    )
    assert entry["score"] == "safe"


@pytest.mark.parametrize(
    ("outcome", "at", "error", "score"),
    [
        ("error", ("primary",), ("BadRequestError", "Error code: 400 - {'code': 'content_policy_violation'}"), "pass"),
        ("error", ("primary",), ("BadRequestError", "Output blocked by content filtering policy"), "pass"),
        # One try, but what the client raised does not carry the reason.
        ("error", ("primary",), ("APIError", "Bad Request"), "safe"),
        ("flagged", ("primary",), None, "safe"),
        # Retried: at the primary, or at the spare (a fail-over on a 400).
        ("error", ("primary", "primary"), ("BadRequestError", "content_policy_violation"), "fail"),
        ("error", ("primary", "spare"), ("BadRequestError", "content_policy_violation"), "fail"),
        ("ok", ("primary",), None, "fail"),
    ],
)
def test_no_retry_of_a_content_policy_400(outcome, at, error, score):
    entry = _score(cell("http-400-content-policy", outcome, at=at, error=error), column="no-retry-of-a-content-policy-400")
    assert entry["score"] == score


@pytest.mark.parametrize(
    ("outcome", "error", "score"),
    [
        ("ok", None, "pass"),
        ("error", ("APIError", "Connection error: peer closed connection"), "safe"),
        ("error", ("BadRequestError", "Error code: 400 - assistant message prefill is not supported"), "fail"),
        ("silent-truncation", None, "fail"),
        ("hang", None, "fail"),
    ],
)
def test_no_prefill_400_after_cut(outcome, error, score):
    entry = _score(
        cell("cut-then-prefill-rejected", outcome, at=("primary", "spare"), error=error), column="no-prefill-400-after-cut"
    )
    assert entry["score"] == score


@pytest.mark.parametrize(
    ("outcome", "at", "score"),
    [
        # Failed at the primary, then straight to the spare for a while, then back at the primary.
        ("ok", ("primary", "spare", "spare", "spare", "primary:ok", "primary:ok"), "pass"),
        # Every request tried the primary first: no circuit.
        ("ok", ("primary", "spare", "primary", "spare", "primary:ok"), "partial"),
        # A spare attempt right after an answer from the primary is a request sent to the spare.
        ("ok", ("primary", "spare", "primary:ok", "spare", "primary:ok"), "pass"),
        # Never came back to the primary.
        ("ok", ("primary", "spare", "spare", "spare"), "partial"),
        ("error", ("primary", "primary", "primary", "primary"), "safe"),
        ("hang", ("primary",), "fail"),
    ],
)
def test_circuit_opens(outcome, at, score):
    assert _score(cell("flapping-primary", outcome, at=at), column="circuit-opens")["score"] == score


@pytest.mark.parametrize(
    ("model", "usage", "score"),
    [
        ("finishline-spare", {"prompt_tokens": 21, "completion_tokens": 16}, "pass"),
        ("finishline-spare", {"input_tokens": 21, "output_tokens": 16}, "pass"),
        # The requested name, not the spare's: the caller cannot tell who answered.
        ("c0001;primary_503_persistent=1", {"prompt_tokens": 21}, "partial"),
        ("finishline-spare", None, "partial"),
    ],
)
def test_fallback_model_and_usage(model, usage, score):
    made = cell("fallback-model-usage", "ok", at=("primary", "spare"), model=model, usage=usage)
    assert _score(made, column="fallback-model-and-usage")["score"] == score


def test_fallback_model_and_usage_without_a_rescue_is_safe_or_fail():
    assert (
        _score(cell("fallback-model-usage", "error", at=("primary",) * 3), column="fallback-model-and-usage")["score"] == "safe"
    )
    assert _score(cell("fallback-model-usage", "hang", at=("primary",)), column="fallback-model-and-usage")["score"] == "fail"


def test_healthy_afterwards_passes_only_when_every_probe_is_ok():
    good = cell("healthy", "ok", at=("primary",))
    wedged = cell(
        "http-429-persistent",
        "error",
        at=("primary",) * 3,
        probe={"ok": False, "outcome": "hang", "why": "no end", "cell_id": "p0002", "tries": 0},
    )
    assert _score(good, column="healthy-afterwards")["score"] == "pass"
    entry = _score(good, wedged, column="healthy-afterwards")
    assert entry["score"] == "fail" and entry["evidence"][0]["cell_id"] == wedged["cell_id"]
    agent = {**cell("healthy", "ok", at=("primary",)), "probe": None}
    assert _score(agent, column="healthy-afterwards")["score"] == "n/a"


@pytest.mark.parametrize(("gap", "score"), [(2.05, "pass"), (1.95, "pass"), (1.5, "fail")])
def test_retry_after_honoured_is_graded_from_the_first_gap(gap, score):
    made = cell("http-429-retry-after", "ok", at=("primary", "primary"))
    made["first_gap_s"] = gap  # the attempts say 1 s apart: the first gap decides
    assert _score(made, column="retry-after-honoured")["score"] == score


def test_scorecard_md_lists_the_conduct_columns_evidence_with_gap_rate_and_probe():
    made = cell("http-429-persistent", "error", gateway="direct", at=("primary",) * 3, gap=0.62, per_s=2)
    card = build_scorecard({"scenarios": _scenarios(), "cells": [made], "gateways": ["direct"], "versions": {}})
    text = render_scorecard_markdown(card)
    assert "| direct |" in text and "backs-off-on-429" in text and "healthy-afterwards" in text
    assert f"`{made['cell_id']}`" in text and "[3 tries, first gap 0.62 s, most 2 in 1 s, probe ok]" in text
    evidence = card["gateways"]["direct"]["backs-off-on-429"]["evidence"][0]
    assert (evidence["first_gap_s"], evidence["max_attempts_per_s"], evidence["probe_ok"]) == (0.62, 2, True)
