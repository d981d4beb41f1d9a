"""Issue 13's done-when for finish_fix in the two new dialects, end to end: real mitmdump with
`-s addons/finish_fix.py` in front of the real worker (or of the hub whose tunnel toxiproxy cuts),
the real client libraries run by the lab's driver hosts, raw bytes read with httpx, and finish_fix's
ledger. The topology and the run: tests/e2e_dialects_run.py (one run serves every test here).

- Healthy Messages and Responses streams come out of mitmdump byte-identical to what the worker
  sends (M1, R1), and the ledger says `clean` with the dialect.
- Messages `stop_reason: null` then `message_stop` (vLLM's abort, the worker's `null_reason=1`):
  finish_fix injects a `message_delta` with `end_turn` (M2); `get_final_message().stop_reason` is
  `end_turn` and pi-ai succeeds; the ledger says `repaired`.
- A stream cut after 5 tokens that the hub ends cleanly (`on_tunnel_drop = "close"`): through
  finish_fix the bytes are the worker's up to the cut, then the dialect's error frames (M4, R3), and
  every client raises with "stream was interrupted" (the AI SDK: an error part, finish `error`);
  the ledger says `interrupted`. Straight at the hub, the same cut is silent for the clients the
  note (shared/notes/dialects.md sections 1 and 2, column A / "ends without a terminal event")
  calls silent: finish_fix is what changes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finishline import Dialect, EventFramer
from labs.clients import LIBRARY_CLIENTS_BY_DIALECT
from tests.dialect_streams import token_texts_of
from tests.e2e_dialects_run import Phase, Request, Route, RunResult, cut_phase, run_topology
from tests.e2e_support import RawResponse

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

DIALECTS = (Dialect.MESSAGES, Dialect.RESPONSES)
#: Healthy streams, by name: worker settings (the same in both dialects).
HEALTHY = {
    "text": "tokens=5",
    "reasoning-and-tool-call": "tokens=3;reasoning_tokens=2;tool_calls=1",
    "close-delimited": "tokens=4;framing=close",
    "content-length": "tokens=4;framing=content-length",
}
NULL_REASON = "tokens=5;null_reason=1"
#: The cut rows' stream: long enough that 5 tokens is mid-answer, slow enough to be a stream.
CUT = "tokens=12;token_delay=0.01"
CUT_AFTER_TOKENS = 5
INTERRUPTED = "stream was interrupted"
#: The whole run (two mitmdumps, two driver hosts, ~60 requests in three phases) takes ~20 s alone
#: on a 2-core machine: generous for a shared one.
RUN_DEADLINE_S = 300


def _requests_for_every_client(case: str, dialect: Dialect, settings: str, route: Route) -> list[Request]:
    return [
        Request(key=f"{case}/{dialect}/{route}/{client}", dialect=dialect, settings=settings, route=route, client=client)
        for client in LIBRARY_CLIENTS_BY_DIALECT[dialect]
    ]


def _raw(case: str, dialect: Dialect, settings: str, route: Route) -> Request:
    return Request(key=f"{case}/{dialect}/{route}/raw", dialect=dialect, settings=settings, route=route)


def _phases() -> list[Phase]:
    untouched = [
        _raw(f"healthy-{name}", dialect, settings, route)
        for name, settings in HEALTHY.items()
        for dialect in DIALECTS
        for route in (Route.WORKER, Route.FINISH_FIX_AT_WORKER)
    ]
    untouched += [_raw("null-reason", Dialect.MESSAGES, NULL_REASON, r) for r in (Route.WORKER, Route.FINISH_FIX_AT_WORKER)]
    untouched += _requests_for_every_client("null-reason", Dialect.MESSAGES, NULL_REASON, Route.FINISH_FIX_AT_WORKER)
    phases = [Phase(requests=tuple(untouched))]
    for dialect in DIALECTS:
        cut = [_raw("cut", dialect, CUT, route) for route in (Route.HUB, Route.FINISH_FIX_AT_HUB)]
        for route in (Route.HUB, Route.FINISH_FIX_AT_HUB):
            cut += _requests_for_every_client("cut", dialect, CUT, route)
        phases.append(cut_phase(dialect, CUT, CUT_AFTER_TOKENS, cut))
    return phases


@pytest.fixture(scope="module")
def run(toxiproxy_server, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run_topology(
        _phases(),
        toxiproxy=toxiproxy_server.client,
        confdir=mitmproxy_confdir,
        run_dir=tmp_path_factory.mktemp("e2e-dialects"),
        deadline_s=RUN_DEADLINE_S,
    )


# -- reading what came back ----------------------------------------------------------------------


def _body(run: RunResult, key: str) -> bytes:
    response: RawResponse = run.raw[key]
    assert (response.status, response.error) == (200, None), (key, response)
    return response.body


def _events(body: bytes) -> list[tuple[str | None, dict]]:
    """Each SSE event's name and parsed data, framed by the core's framer, as a client would."""
    framer = EventFramer()
    events = framer.receive_data(body)
    leftover = framer.receive_end()
    assert leftover is None, f"an incomplete event at the end: {leftover!r}"
    return [(e.event_type.decode() if e.event_type else None, json.loads(e.data)) for e in events if e.data]


def _worker_bytes(run: RunResult, key: str) -> bytes:
    """The body the worker sends for the request `key`, decoded from its framing."""
    return b"".join(segment.event for segment in run.plan(key).segments)


def _bytes_before_cut(run: RunResult, key: str) -> bytes:
    """The cut rows' body for the request `key` as the tunnel lets it through: the events up to
    the 5th token's."""
    plan = run.plan(key)
    offset, events = plan.head_length, b""
    for segment in plan.segments:
        if offset >= plan.offset_after_tokens(CUT_AFTER_TOKENS):
            break
        offset += len(segment.framed)
        events += segment.event
    return events


def _one_ledger_row(run: RunResult, key: str, route: Route) -> dict:
    rows = run.ledger_rows(key, route)
    assert len(rows) == 1, (key, rows, run.mitmdump_logs[route][-3000:])
    return rows[0]


def _report(run: RunResult, key: str) -> dict:
    report = run.reports[key]
    assert report.get("timed_out") is False, report
    return report


# -- healthy streams: byte-identical, booked clean -------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_stream_comes_out_byte_identical_and_is_booked_clean(run, dialect, name):
    # The worker's plan is what the worker sends (so the comparison below is with the real bytes).
    direct = f"healthy-{name}/{dialect}/{Route.WORKER}/raw"
    assert _body(run, direct) == _worker_bytes(run, direct)
    key = f"healthy-{name}/{dialect}/{Route.FINISH_FIX_AT_WORKER}/raw"
    assert _body(run, key) == _worker_bytes(run, key)
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_WORKER)
    assert (row["verdict"], row["dialect"], row["injected"]) == ("clean", dialect.value, []), row


# -- M2: stop_reason null then message_stop ---------------------------------------------------------


def test_null_stop_reason_gets_end_turn_injected_right_before_message_stop(run):
    key = f"null-reason/{Dialect.MESSAGES}/{Route.FINISH_FIX_AT_WORKER}/raw"
    # The worker's bytes for this request; a direct request shows the plan is what it sends.
    direct = f"null-reason/{Dialect.MESSAGES}/{Route.WORKER}/raw"
    assert _body(run, direct) == _worker_bytes(run, direct)
    upstream = _worker_bytes(run, key)
    *upstream_events, (_, last) = _events(upstream)
    assert last == {"type": "message_stop"}
    assert [d["delta"]["stop_reason"] for name, d in upstream_events if name == "message_delta"] == [None]
    output_tokens = next(d["usage"]["output_tokens"] for name, d in upstream_events if name == "message_delta")

    body = _body(run, key)
    # The upstream's bytes, with one frame more right before its own `message_stop` frame.
    upstream_stop = upstream[upstream.rindex(b"event: message_stop") :]
    before_stop = upstream[: -len(upstream_stop)]
    assert body.startswith(before_stop) and body.endswith(upstream_stop), body
    assert _events(body[len(before_stop) : -len(upstream_stop)]) == [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
    ], body
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_WORKER)
    assert (row["verdict"], row["dialect"]) == ("repaired", "messages"), row


#: Through finish_fix, the null-reason stream is a finished turn for every Messages client: the
#: reason as each library surfaces it (without finish_fix: None, the AI SDK `other`, pi-ai an error;
#: tests/test_clients_dialects.py).
NULL_REASON_THROUGH_FINISH_FIX = {
    "anthropic-python": "end_turn",
    "anthropic-python-helper": "end_turn",  # get_final_message().stop_reason
    "langchain": "end_turn",
    "anthropic-node": "end_turn",
    "anthropic-node-helper": "end_turn",
    "ai-sdk-anthropic": "stop",
    "pi-ai": "stop",
}


@pytest.mark.parametrize("client", LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES])
def test_null_stop_reason_through_finish_fix_is_a_finished_turn_for_every_messages_client(run, client):
    key = f"null-reason/{Dialect.MESSAGES}/{Route.FINISH_FIX_AT_WORKER}/{client}"
    report = _report(run, key)
    assert (report["completed"], report["finish_reason"]) == (True, NULL_REASON_THROUGH_FINISH_FIX[client]), report
    assert report["text"] == "".join(token_texts_of(Dialect.MESSAGES, _worker_bytes(run, key))), report
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_WORKER)
    assert (row["verdict"], row["dialect"]) == ("repaired", "messages"), row


# -- M4 / R3: a cut the hub ends cleanly -----------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_hub_ends_the_cut_stream_cleanly_after_the_5th_token(run, dialect):
    # The premise of the cut rows: straight at the hub, the body is the worker's up to the 5th
    # token event and then a clean end (no transport error), and the hub says it closed it.
    key = f"cut/{dialect}/{Route.HUB}/raw"
    assert _body(run, key) == _bytes_before_cut(run, key)
    assert len(token_texts_of(dialect, _body(run, key))) == CUT_AFTER_TOKENS
    cut_models = {run.models[k] for k in run.models if k.startswith(f"cut/{dialect}/")}
    actions = {(e.upstream_ending, e.action) for e in run.hub_exchanges if e.model in cut_models}
    assert actions == {("fin", "clean_end")}, actions


def test_a_cut_messages_stream_ends_in_one_api_error_event_through_finish_fix(run):
    key = f"cut/{Dialect.MESSAGES}/{Route.FINISH_FIX_AT_HUB}/raw"
    body, before = _body(run, key), _bytes_before_cut(run, key)
    assert body.startswith(before), body
    [(name, error)] = _events(body[len(before) :])
    assert (name, error["type"], error["error"]["type"]) == ("error", "error", "api_error"), error
    assert INTERRUPTED in error["error"]["message"], error
    assert error["error"]["message"].endswith("(finish_fix)"), error
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_HUB)
    assert (row["verdict"], row["dialect"]) == ("interrupted", "messages"), row


def test_a_cut_responses_stream_ends_in_error_then_response_failed_through_finish_fix(run):
    key = f"cut/{Dialect.RESPONSES}/{Route.FINISH_FIX_AT_HUB}/raw"
    body, before = _body(run, key), _bytes_before_cut(run, key)
    assert body.startswith(before), body
    upstream_events = _events(before)
    last_number = upstream_events[-1][1]["sequence_number"]
    created = next(data["response"] for name, data in upstream_events if name == "response.created")
    [(error_name, error), (failed_name, failed)] = _events(body[len(before) :])
    assert (error_name, error["type"], error["sequence_number"]) == ("error", "error", last_number + 1), error
    assert (error["error"]["type"], error["error"]["code"]) == ("server_error", "stream_interrupted"), error
    assert INTERRUPTED in error["message"] and error["message"] == error["error"]["message"], error
    assert (failed_name, failed["type"], failed["sequence_number"]) == ("response.failed", "response.failed", last_number + 2)
    assert (failed["response"]["id"], failed["response"]["status"]) == (created["id"], "failed"), failed
    assert INTERRUPTED in failed["response"]["error"]["message"], failed
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_HUB)
    assert (row["verdict"], row["dialect"]) == ("interrupted", "responses"), row


CUT_CELLS = [(d, c) for d in DIALECTS for c in LIBRARY_CLIENTS_BY_DIALECT[d]]


@pytest.mark.parametrize(("dialect", "client"), CUT_CELLS, ids=[f"{d}-{c}" for d, c in CUT_CELLS])
def test_a_cut_stream_through_finish_fix_is_an_error_for_every_client(run, dialect, client):
    # Issue 13 names four Messages clients and every Responses one; every Messages client does it
    # too. The AI SDK's providers stream an error part (and finish `error`), which its driver
    # raises as the SDK's `StreamProviderError`, finish_fix's message as its message.
    key = f"cut/{dialect}/{Route.FINISH_FIX_AT_HUB}/{client}"
    report = _report(run, key)
    assert report["completed"] is False, report
    assert INTERRUPTED in report["error_message"], report
    # What came before the cut reached the application.
    assert report["text"] == "".join(token_texts_of(dialect, _bytes_before_cut(run, key))), report
    row = _one_ledger_row(run, key, Route.FINISH_FIX_AT_HUB)
    assert (row["verdict"], row["dialect"]) == ("interrupted", dialect.value), row


#: Straight at the hub (no finish_fix), the same cut, as shared/notes/dialects.md says each client
#: takes a clean end without the terminator: (completed, finish reason or error class, a fragment
#: of the error message).
SILENT = (True, None, None)
CUT_WITHOUT_FINISH_FIX = {
    Dialect.MESSAGES: {
        "anthropic-python": SILENT,  # the iteration just ends
        "anthropic-python-helper": SILENT,  # get_final_message(): the partial snapshot, stop_reason None
        "langchain": SILENT,  # a partial AIMessage
        "anthropic-node": SILENT,
        "anthropic-node-helper": (False, "AnthropicError", "stream ended without producing a Message with role=assistant"),
        "ai-sdk-anthropic": (True, "interrupted", None),
        "pi-ai": (False, "PiStreamError(error)", "Anthropic stream ended before message_stop"),
    },
    Dialect.RESPONSES: {
        "openai-python": SILENT,
        "openai-python-helper": (False, "RuntimeError", "Didn't receive a `response.completed` event."),
        "langchain": SILENT,
        "openai-node": SILENT,
        "openai-node-helper": (True, "in_progress", None),  # finalResponse() resolves with the snapshot
        "ai-sdk-openai": (True, "interrupted", None),
        "pi-ai": (False, "PiStreamError(error)", "OpenAI Responses stream ended before a terminal response event"),
    },
}


@pytest.mark.parametrize(("dialect", "client"), CUT_CELLS, ids=[f"{d}-{c}" for d, c in CUT_CELLS])
def test_without_finish_fix_the_same_cut_is_what_the_note_says(run, dialect, client):
    key = f"cut/{dialect}/{Route.HUB}/{client}"
    report = _report(run, key)
    completed, word, fragment = CUT_WITHOUT_FINISH_FIX[dialect][client]
    assert report["completed"] is completed, report
    assert (report["finish_reason"] if completed else report["error_class"]) == word, report
    assert fragment is None or fragment in report["error_message"], report
    assert report["text"] == "".join(token_texts_of(dialect, _bytes_before_cut(run, key))), report


def test_every_client_of_both_dialects_is_in_the_tables():
    for dialect in DIALECTS:
        assert set(CUT_WITHOUT_FINISH_FIX[dialect]) == set(LIBRARY_CLIENTS_BY_DIALECT[dialect])
    assert set(NULL_REASON_THROUGH_FINISH_FIX) == set(LIBRARY_CLIENTS_BY_DIALECT[Dialect.MESSAGES])
