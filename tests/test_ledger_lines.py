"""finish_fix's ledger line, one per flow in scope, whichever way the flow ended: a stream, a whole
(non-streamed) response, or no response at all. Each path books one `finishline.Booking`; the line
is the flow's request line and status, then the booking's `to_json`, in the order
docs/repair-rules.md lists the keys."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from mitmproxy import flow as mitm_flow
from mitmproxy.test import taddons

from finishline import Booking, Dialect, Verdict, book_missing_response
from finishline.addon import cut_hook
from finishline.addon.hooks import FinishFix
from finishline.addon.stream import stream_of
from tests.feeding import chunk, sse
from tests.test_addon import make_flow, stream_through

DOCS = Path(__file__).resolve().parents[1] / "docs" / "repair-rules.md"
COMPLETION = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"content": "hi"}}],
    "usage": {"completion_tokens": 4},
}


def _documented_keys() -> list[str]:
    """The ledger's keys as docs/repair-rules.md ("The books") names them, in its order."""
    passage = DOCS.read_text().split("one JSON line per flow in scope, with these", 1)[1].split("Never headers", 1)[0]
    return re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", passage))


@pytest.fixture
def booked(tmp_path):
    """finish_fix with a ledger, and a way to read its lines as written."""
    fix = FinishFix()
    ledger = tmp_path / "ledger.jsonl"
    with taddons.context(fix) as tctx:
        tctx.configure(fix, finish_fix_ledger=str(ledger))
        yield fix, lambda: ledger.read_text().splitlines()
    cut_hook.uninstall()


def _whole_response(fix) -> mitm_flow.Flow:
    flow = make_flow(body=b'{"model": "m2", "max_tokens": 4}', content_type="application/json")
    flow.response.content = json.dumps(COMPLETION).encode()
    fix.requestheaders(flow)
    fix.responseheaders(flow)
    fix.response(flow)
    return flow


def _no_response(fix, message: str = "Server connection to example.com failed: Connection refused") -> mitm_flow.Flow:
    flow = make_flow("/v1/responses", body=b'{"model": "m3", "stream": true}')
    flow.response = None
    flow.error = mitm_flow.Error(message)
    fix.error(flow)
    return flow


def _flow_part(flow, status) -> dict:
    request = flow.request
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.timestamp_start)),
        "method": "POST",
        "url": request.pretty_url,
        "status": status,
    }


def test_every_path_writes_the_documented_keys_in_the_documented_order(booked):
    fix, lines = booked
    stream_through(fix, make_flow(), [sse(chunk("x"), b"[DONE]")])
    _whole_response(fix)
    _no_response(fix)
    documented = _documented_keys()
    assert documented[:4] == ["time", "method", "url", "status"] and documented[-2:] == ["injected", "repairs"]
    assert [list(json.loads(line)) for line in lines()] == [documented] * 3


def test_a_stream_line_is_its_report_with_the_times_rounded(booked):
    fix, lines = booked
    flow = make_flow()
    stream_through(fix, flow, [sse(chunk("x"), b"[DONE]")])
    report = stream_of(flow).repair.report
    (line,) = lines()
    assert line == json.dumps(
        {
            **_flow_part(flow, 200),
            "model": "m1",
            "dialect": "chat",
            "verdict": "repaired",
            "detail": report.detail,
            "events": 2,
            "upstream_bytes": report.upstream_bytes,
            "client_bytes": report.client_bytes,
            "time_to_first_event": round(report.time_to_first_event, 4),
            "duration": round(report.duration, 4),
            "injected": [{"kind": "finish", "choice": 0, "finish_reason": "stop"}],
            "repairs": ["injected finish_reason 'stop' for choice 0 before [DONE]"],
        }
    )


def test_a_whole_response_line_has_no_stream_counts_and_the_flows_duration(booked):
    fix, lines = booked
    flow = _whole_response(fix)
    (line,) = lines()
    assert line == json.dumps(
        {
            **_flow_part(flow, 200),
            "model": "m2",
            "dialect": "chat",
            "verdict": "repaired",
            "detail": "repaired: set finish_reason 'length' for choice 0",
            "events": None,
            "upstream_bytes": None,
            "client_bytes": len(flow.response.content),
            "time_to_first_event": None,
            "duration": flow.response.timestamp_end - flow.request.timestamp_start,
            "injected": [],
            "repairs": ["set finish_reason 'length' for choice 0"],
        }
    )
    # mitmweb's record of the flow holds the same booking.
    assert flow.metadata["finish_fix"] == {
        key: value for key, value in json.loads(line).items() if key not in _flow_part(flow, 200)
    }


@pytest.mark.parametrize(
    ("message", "verdict", "detail"),
    [
        ("Client disconnected.", "skipped", "skipped: the client went away before the response"),
        (
            "Server connection to example.com failed: Connection refused",
            "http_error",
            "http_error: no upstream response (Server connection to example.com failed: Connection refused)",
        ),
    ],
)
def test_a_flow_without_a_response_has_only_its_request_and_verdict(booked, message, verdict, detail):
    fix, lines = booked
    flow = _no_response(fix, message)
    (line,) = lines()
    assert line == json.dumps(
        {
            **_flow_part(flow, None),
            "model": "m3",
            "dialect": "responses",
            "verdict": verdict,
            "detail": detail,
            "events": None,
            "upstream_bytes": None,
            "client_bytes": None,
            "time_to_first_event": None,
            "duration": None,
            "injected": [],
            "repairs": [],
        }
    )


def test_a_booking_rounds_its_times_to_a_tenth_of_a_millisecond_and_says_its_words():
    booking = Booking(verdict=Verdict.REPAIRED, detail="d", dialect=Dialect.MESSAGES, time_to_first_event=0.123456, duration=2)
    record = booking.to_json()
    assert (record["verdict"], record["dialect"], record["time_to_first_event"], record["duration"]) == (
        "repaired",
        "messages",
        0.1235,
        2,
    )


def test_a_missing_response_is_booked_with_the_requests_model_and_dialect():
    booking = book_missing_response("reset", client_gone=False, model="m", dialect=Dialect.RESPONSES)
    assert (booking.verdict, booking.model, booking.dialect, booking.client_bytes) == (
        Verdict.HTTP_ERROR,
        "m",
        Dialect.RESPONSES,
        None,
    )
