"""Evidence per cell (labs.evidence): the first gap, the most attempts in one second, and the probe's
id, model and answer; and the runner's records of them from the workers' attempts."""

from __future__ import annotations

import pytest

from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.cell_result import CellResult
from labs.dialects import LAB_DIALECTS
from labs.evidence import (
    PROBE_SETTINGS,
    first_gap_s,
    max_attempts_per_s,
    probe_expected,
    probe_id,
    probe_json,
    probe_model_name,
)
from labs.outcome import ClientReport, Judgement, Outcome, judge
from labs.topology import attach_workers
from labs.worker import Attempt, RunningWorker, WorkerSettings
from labs.worker.settings import parse_settings


def test_the_first_gap_is_from_the_first_arrival_to_the_second_in_any_order():
    assert first_gap_s([12.5, 10.0, 10.75]) == 0.75
    assert first_gap_s([3.0]) is None
    assert first_gap_s([]) is None


@pytest.mark.parametrize(
    ("arrivals", "most"),
    [
        ([], 0),
        ([5.0], 1),
        # Three within one second of the first, the fourth a second after it: not in its window.
        ([0.0, 0.2, 0.9, 1.0], 3),
        # A window starts at any attempt, not at whole clock seconds.
        ([0.0, 0.6, 1.1, 1.4, 1.5, 2.7], 4),
        # A tight loop: ten in half a second.
        ([i * 0.05 for i in range(10)], 10),
        ([0.0, 2.0, 4.0], 1),
    ],
)
def test_max_attempts_per_s_is_the_fullest_one_second_window(arrivals, most):
    assert max_attempts_per_s(arrivals) == most
    assert max_attempts_per_s(list(reversed(arrivals))) == most


def test_a_probe_has_its_own_id_of_a_cells_length_and_healthy_settings():
    assert probe_id("c0042") == "p0042"
    model = probe_model_name("c0042")
    assert cell_id_of(model) == "p0042" and cell_id_of("via-finish-fix/" + model) == "p0042"
    settings = parse_settings(model)
    assert settings == PROBE_SETTINGS
    assert settings.http_error is None and settings.primary_failure is None and settings.answers_at_all


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_the_probes_answer_is_the_workers_healthy_answer_in_the_dialects_words(dialect):
    expected = probe_expected(dialect)
    assert expected.text and expected.http_error is None
    assert (
        expected.finish_reason
        == {"chat": "stop", "messages": "end_turn", "responses": "completed", "gemini": "STOP"}[dialect.value]
    )
    whole = ClientReport(client="c", completed=True, text=expected.text, finish_reason=expected.finish_reason)
    assert probe_json("p0001", whole, judge(whole, expected))["ok"] is True
    short = ClientReport(client="c", completed=True, text=expected.text[:3], finish_reason=expected.finish_reason)
    assert probe_json("p0001", short, judge(short, expected))["ok"] is False


def test_probe_json_says_ok_only_for_an_ok_outcome():
    report = ClientReport(client="c", completed=False, error_class="APIError", duration_s=1.5)
    entry = probe_json("p0003", report, Judgement(outcome=Outcome.ERROR, reason="APIError: boom"))
    assert entry == {"ok": False, "outcome": "error", "why": "APIError: boom", "cell_id": "p0003", "tries": None, "total_s": 1.5}


def _attempt(cell: str, server: str, at: float) -> Attempt:
    return Attempt(
        cell_id=cell,
        server=server,
        dialect=Dialect.CHAT,
        arrived_at=at,
        head_s=0.01,
        first_token_s=None,
        ended="complete",
        status=200,
    )


def test_the_runner_records_the_evidence_from_the_gateways_attempts_and_the_probes_apart():
    def worker(name: str, attempts: list[Attempt]) -> RunningWorker:
        return RunningWorker(host="127.0.0.1", port=1, defaults=WorkerSettings(), handled=[], name=name, attempts=attempts)

    primary = worker(
        "primary", [_attempt("c0001", "primary", 10.0), _attempt("c0001", "primary", 10.3), _attempt("p0001", "primary", 30.0)]
    )
    spare = worker("spare", [_attempt("c0001", "spare", 10.6), _attempt("c0001", "spare", 12.0)])
    result = CellResult(
        scenario="s",
        client="openai-python",
        gateway="litellm",
        cell_id="c0001",
        outcome=Outcome.OK,
        why="",
        report={},
        request_model="c0001",
        topology="tunnel+spare",
        probe={"ok": True, "outcome": "ok", "why": "", "cell_id": "p0001", "tries": None, "total_s": 0.2},
    )
    attach_workers([result], {"primary": primary, "spare": spare}, None)
    # The probe's attempt is not the cell's: four tries, the first gap 0.3 s, three within a second.
    assert (result.tries, result.first_gap_s, result.max_attempts_per_s) == (4, 0.3, 3)
    assert [a["at"] for a in result.attempts] == ["primary", "primary", "spare", "spare"]
    assert result.probe is not None and result.probe["tries"] == 1
    assert {"first_gap_s", "max_attempts_per_s", "probe"} <= set(result.to_json())


def test_a_cell_of_several_requests_is_booked_error_when_any_of_its_requests_is(tmp_path):
    from labs.cell_books import attach_books
    from labs.gateways.services import Gateway

    books = tmp_path / "books.jsonl"
    # c0001: a request that failed, one that succeeded; c0002: a request whose first try failed
    # and whose fallback succeeded (one call id: one request, rescued); c0003: one request.
    lines = [
        ("c0001", "failure", "a"),
        ("c0001", "success", "b"),
        ("c0002", "failure", "c"),
        ("c0002", "success", "c"),
        ("c0003", "success", "d"),
    ]
    books.write_text(
        "".join(
            f'{{"model": "{cell};primary_503_first=10", "status": "{status}", "call_id": "{call}"}}\n'
            for cell, status, call in lines
        )
    )
    gateways = {"litellm": Gateway(name="litellm", base_url="http://x", books_path=books, books_kind="litellm")}

    def cell(cell_id: str, outcome: Outcome, requests: int) -> CellResult:
        return CellResult(
            scenario="flapping-primary",
            client="openai-python",
            gateway="litellm",
            cell_id=cell_id,
            outcome=outcome,
            why="",
            report={},
            request_model=cell_id,
            requests=[{"outcome": outcome, "why": "", "total_s": 1.0}] * requests,
        )

    several, healthy, single = cell("c0001", Outcome.ERROR, 2), cell("c0002", Outcome.OK, 2), cell("c0003", Outcome.OK, 0)
    attach_books([several, healthy, single], gateways)
    assert (several.books, several.books_mismatch) == ("error", False)
    assert several.books_entry is not None and several.books_entry["status"] == "failure"
    assert (healthy.books, healthy.books_mismatch) == ("ok", False)
    assert single.books == "ok"
