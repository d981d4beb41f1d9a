"""The runner end to end: one small real matrix (tests/fixtures_chaos.py), real clients, gateways,
worker and toxiproxy; and the books matching it relies on."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from labs.cell_result import CellResult
from labs.clients import AGENT_CLIENTS
from labs.gateways.services import Gateway, books_entry
from labs.hub import Hub, HubExchange, TunnelDropPolicy
from labs.outcome import Outcome
from labs.scenario import SCENARIO_DIR, load_scenario
from labs.topology import attach_workers
from labs.worker import RunningWorker, WorkerSettings
from labs.worker.wire import response_plan

# The first test pays for the small matrix (~45 s here; the fixture itself is bounded at 240 s).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # a backstop: tests/fixtures_chaos.py


def test_every_planned_cell_has_an_outcome_from_the_closed_set(small_matrix):
    outcomes = {c["outcome"] for c in small_matrix.result["cells"]}
    assert outcomes <= {"ok", "error", "flagged", "hang", "silent-truncation"}
    # 3 scenarios x 10 clients x 2 gateways, the conn-close row (2 clients), the stall (2 clients),
    # the LiteLLM row (1 client), 5 scenarios x 10 clients through finish_fix, 2 x 3 clients through
    # litellm+finish_fix.
    # The hub's rows: the incident (3 clients x 2 gateways, and 1 through LiteLLM), the error event
    # (2 clients), the rule-1 rows (2 scenarios x 1 client x 2 gateways).
    assert len(small_matrix.result["cells"]) == 3 * 10 * 2 + 2 + 2 + 1 + 5 * 10 + 2 * 3 + 3 * 2 + 1 + 2 + 2 * 2


def test_a_stalled_worker_is_a_hang_at_the_scenarios_deadline(small_matrix):
    for client in ("httpx-sse", "openai-node"):
        cell = small_matrix.cell("stall-after-tokens", client, "direct")
        assert cell["outcome"] == "hang", cell
        # Stopped by the scenario's deadline, not by an end of the stream (no timing is asserted).
        assert cell["report"]["timed_out"] is True
        # The 5 tokens before the stall arrived.
        assert cell["report"]["text"] == "The quick brown fox jumps"


def test_a_dropped_length_reason_is_a_silent_truncation(small_matrix):
    cell = small_matrix.cell("length-omitted", "openai-python", "direct")
    assert cell["outcome"] == "silent-truncation"
    assert cell["why"] == "full text, but finish reason None where the worker's was 'length'"


def test_finish_fix_books_record_every_request_it_saw(small_matrix):
    cells = [c for c in small_matrix.result["cells"] if c["gateway"] == "finish_fix"]
    assert all(c["books_entry"] is not None for c in cells)
    cut = small_matrix.cell("cut-after-tokens-fin", "pi-ai", "finish_fix")
    assert (cut["books"], cut["books_entry"]["verdict"]) == ("error", "interrupted")
    repaired = small_matrix.cell("reason-omitted", "openai-python", "finish_fix")
    assert (repaired["books"], repaired["books_entry"]["verdict"]) == ("ok", "repaired")


def test_litellm_books_say_success_for_the_silently_truncated_stream(small_matrix):
    # LiteLLM 1.108.7 invents `stop` for a stream without finish_reason (streaming_handler.py
    # finish_reason_handler), so the client sees success with the wrong reason, and the books agree
    # with the gateway, not with the truth: the mismatch is flagged.
    cell = small_matrix.cell("length-omitted-litellm", "httpx-sse", "litellm")
    assert cell["outcome"] == "silent-truncation"
    assert cell["report"]["finish_reason"] == "stop"
    assert cell["books"] == "ok" and cell["books_entry"]["status"] == "success"
    assert cell["books_mismatch"] is True


def test_the_run_writes_its_books_and_logs_under_its_run_dir(small_matrix):
    run_dir = Path(small_matrix.result["run_dir"])
    for name in ("finish_fix-ledger.jsonl", "litellm-books.jsonl", "mitmdump.log", "litellm.log", "toxiproxy.log"):
        assert (run_dir / name).exists(), name
    # Each other topology's gateways keep theirs in a folder of its own.
    assert (run_dir / "hub" / "mitmdump.log").exists()
    # ... except the run's one LiteLLM, which serves every topology (by route prefix) from the run dir.
    assert (run_dir / "hub+spare").is_dir() and not (run_dir / "hub+spare" / "litellm.log").exists()


def test_books_entries_are_matched_by_the_cell_id_in_the_model_name():
    gateway = Gateway(name="litellm+finish_fix", base_url="http://x", books_path=Path("b"), books_kind="litellm")
    entries = [
        {"model": "via-finish-fix/c0002;tokens=3", "status": "success"},
        {"model": "c0001;tokens=3", "status": "failure"},
    ]
    assert books_entry(gateway, entries, "c0001") == ("error", entries[1])
    assert books_entry(gateway, entries, "c0002") == ("ok", entries[0])
    assert books_entry(gateway, entries, "c0003") == (None, None)


def test_finish_fix_verdicts_map_to_books_words():
    gateway = Gateway(name="finish_fix", base_url="http://x", books_path=Path("b"), books_kind="finish_fix")
    words = {
        verdict: books_entry(gateway, [{"model": "c0001;x=1", "verdict": verdict}], "c0001")[0]
        for verdict in ("clean", "repaired", "interrupted", "upstream_error", "malformed", "http_error", "skipped")
    }
    assert words == {
        "clean": "ok",
        "repaired": "ok",
        "interrupted": "error",
        "upstream_error": "error",
        "malformed": "error",
        "http_error": "error",
        "skipped": None,
    }


# -- the hub, the incident and the spare worker (issue 7) -------------------------------------------

INCIDENT = "incident-prefill-cut-hub-close"


def test_the_incident_through_direct_is_what_the_post_mortem_showed(small_matrix):
    # The hub ends the response cleanly: a 200 whose body has no event at all. The OpenAI SDKs take
    # that for an empty success; Pi is strict about the missing finish_reason.
    for client in ("openai-python", "openai-node"):
        cell = small_matrix.cell(INCIDENT, client, "direct")
        assert cell["outcome"] == "silent-truncation", cell
        assert cell["report"]["text"] == ""
    pi = small_matrix.cell(INCIDENT, "pi-ai", "direct")
    assert pi["outcome"] == "error"
    assert pi["why"].endswith("Stream ended without finish_reason")
    assert pi["topology"] == "hub"
    assert pi["hub"] == ["tunnel fin after 0 body bytes; hub close: clean_end"]
    assert (pi["answered_by"], pi["worker_requests"]) == ("primary", {"primary": 1})


def test_through_finish_fix_every_client_is_told_the_stream_stopped_before_the_first_token(small_matrix):
    for client in ("openai-python", "openai-node", "pi-ai"):
        cell = small_matrix.cell(INCIDENT, client, "finish_fix")
        assert cell["outcome"] == "error", cell
        assert "before the first token" in cell["why"]
        assert (cell["books"], cell["books_entry"]["verdict"]) == ("error", "interrupted")


def test_through_litellm_the_incident_is_an_empty_success_its_books_call_a_success(small_matrix):
    # LiteLLM 1.108.7 makes up `stop` and `[DONE]` for the empty stream, and its success handler,
    # with no response to assemble, books it through `async_log_stream_event`: a success with no
    # usage (labs/gateways/litellm_books.py), which is flagged. The whole row: tests/test_lab_incident.py.
    cell = small_matrix.cell(f"{INCIDENT}-litellm", "httpx-sse", "litellm")
    assert cell["outcome"] == "silent-truncation", cell
    assert (cell["report"]["text"], cell["report"]["finish_reason"]) == ("", "stop")
    assert (cell["books"], cell["books_entry"]["hook"], cell["books_mismatch"]) == ("ok", "async_log_stream_event", True)
    assert (cell["answered_by"], cell["worker_requests"]) == ("primary", {"primary": 1})


def test_the_fixed_hubs_error_event_reaches_the_client_as_an_error(small_matrix):
    # The tunnel drops after 5 token events: the hub relayed the body's events up to the 5th.
    scenario = load_scenario(SCENARIO_DIR / "cut-after-tokens-hub-error-event.toml")
    plan = response_plan(scenario.resolved)
    ends = list(itertools.accumulate(len(segment.event) for segment in plan.segments))
    fifth = [number for number, segment in enumerate(plan.segments) if segment.kind == "token"][4]
    for client in ("openai-python", "pi-ai"):
        cell = small_matrix.cell("cut-after-tokens-hub-error-event", client, "direct")
        assert cell["outcome"] == "error", cell
        assert "agent disconnected mid-request" in cell["why"]
        assert cell["hub"] == [f"tunnel fin after {ends[fifth]} body bytes; hub error_event: error_event"]


def test_rule_1_direct_never_reaches_the_spare(small_matrix):
    for name in ("rule1-prefill-cut-hub-close-spare", "rule1-prefill-cut-hub-abort-spare"):
        cell = small_matrix.cell(name, "httpx-sse", "direct")
        assert cell["outcome"] != "ok"
        assert (cell["answered_by"], cell["worker_requests"]) == ("primary", {"primary": 1})


def test_rule_1_litellm_retries_a_visible_prefill_cut_on_the_spare(small_matrix):
    # LiteLLM 1.108.7 (router.py): `_acompletion` reads a stream's first chunk before it returns,
    # so a body that ends before it is an error inside the retries: the primary is tried
    # 1 + num_retries (2, the shipped default) times, then the request falls to the next `order`
    # deployment, the spare, which answers in full. The hub passed the FIN on (`abort`).
    cell = small_matrix.cell("rule1-prefill-cut-hub-abort-spare", "httpx-sse", "litellm")
    assert cell["outcome"] == "ok", cell
    assert (cell["answered_by"], cell["worker_requests"]) == ("spare", {"primary": 3, "spare": 1})
    assert cell["hub"] == ["tunnel fin after 0 body bytes; hub abort: fin"] * 3


def test_rule_1_a_hub_that_ends_cleanly_hides_the_failure_from_litellms_retries(small_matrix):
    # With the post-mortem's hub, LiteLLM sees a complete, empty 200: nothing to retry, and the
    # client gets LiteLLM's made-up ending with no text.
    cell = small_matrix.cell("rule1-prefill-cut-hub-close-spare", "httpx-sse", "litellm")
    assert cell["outcome"] == "silent-truncation", cell
    assert (cell["answered_by"], cell["worker_requests"]) == ("primary", {"primary": 1})


def test_the_spare_answered_when_it_saw_the_request_else_the_primary():
    def worker(*models):
        return RunningWorker(host="127.0.0.1", port=1, defaults=WorkerSettings(), handled=[], arrivals=list(models))

    primary = worker("c0001;tokens=3", "c0002;tokens=3", "c0002;tokens=3", "via-finish-fix/c0003;tokens=3")
    spare = worker("c0002;tokens=3")
    exchange = HubExchange(
        method="POST",
        path="/v1/chat/completions",
        model="c0001;tokens=3",
        policy=TunnelDropPolicy.CLOSE,
        status=200,
        upstream_ending="fin",
        action="clean_end",
        body_bytes=0,
    )
    hub = Hub(
        host="127.0.0.1", port=2, upstream_host="127.0.0.1", upstream_port=3, _policy=TunnelDropPolicy.CLOSE, exchanges=[exchange]
    )
    results = [
        CellResult(
            scenario="s",
            client="httpx-sse",
            gateway="litellm",
            cell_id=cell,
            outcome=Outcome.OK,
            why="",
            report={},
            request_model=f"{cell};tokens=3",
        )
        for cell in ("c0001", "c0002", "c0003", "c0004")
    ]
    attach_workers(results, {"primary": primary, "spare": spare}, hub)
    assert [(r.answered_by, r.worker_requests) for r in results] == [
        ("primary", {"primary": 1}),
        ("spare", {"primary": 2, "spare": 1}),
        ("primary", {"primary": 1}),
        (None, {}),
    ]
    assert results[0].hub == ["tunnel fin after 0 body bytes; hub close: clean_end"] and results[1].hub == []


def test_every_cell_carries_its_evidence_and_a_probe_that_is_not_one_of_its_attempts(small_matrix):
    for cell in small_matrix.result["cells"]:
        assert {"first_gap_s", "max_attempts_per_s", "probe"} <= set(cell)
        assert all(a["cell_id"] == cell["cell_id"] for a in cell["attempts"])
        if cell["tries"] and cell["tries"] > 1:
            assert cell["first_gap_s"] is not None and cell["max_attempts_per_s"] >= 1
        if cell["client"] in AGENT_CLIENTS:
            assert cell["probe"] is None  # an agent's cell has none (labs.evidence)
            continue
        # The probe runs once the fault is lifted: healthy through every gateway of the small matrix.
        assert cell["probe"]["ok"], (cell["scenario"], cell["gateway"], cell["client"], cell["probe"])
        assert cell["probe"]["cell_id"] == "p" + cell["cell_id"][1:] and cell["probe"]["tries"] >= 1
