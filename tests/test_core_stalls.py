"""Stall deadlines in the repair core: `RepairPolicy.idle_timeout` and `first_token_timeout`, driven
by the caller's clock through `next_stall_check(now)` and `receive_timer(now)`. One test per rule;
times are plain numbers (the core has no clock)."""

from __future__ import annotations

import pytest

from finishline import ClientEnding, CutCause, LocalProtocolError, OnCut, RepairPolicy, StreamRepair, Verdict
from tests.feeding import chunk, data_events, sse

COMMENT = b": keep-alive\n\n"


def machine(idle: float = 2, first_token: float = 0, on_cut: OnCut = OnCut.ERROR, **kwargs) -> StreamRepair:
    policy = RepairPolicy(idle_timeout=idle, first_token_timeout=first_token, on_cut=on_cut)
    return StreamRepair(policy=policy, started_at=0.0, sent_at=0.0, **kwargs)


def test_idle_deadline_passes_one_idle_timeout_after_the_last_event():
    repair = machine(idle=2)
    events = sse(chunk("a"), chunk("b"), chunk("c"))
    assert repair.receive_data(events, now=1.0) == events
    assert repair.next_stall_check(1.0) == 3.0
    assert repair.receive_timer(2.9) is None and not repair.ended
    ending = repair.receive_timer(3.0)
    assert isinstance(ending, ClientEnding) and ending.end_response is True and repair.ended
    error = data_events(ending.client_bytes)[0]["error"]
    assert error == {
        "message": "stream was interrupted: no event for 2 s after 3 events; the upstream stalled (finish_fix)",
        "type": "server_error",
        "code": "stream_interrupted",
    }
    report = repair.report
    assert report.verdict is Verdict.INTERRUPTED
    assert report.interruption.cause is CutCause.STALLED and report.interruption.how == "stalled: no event for 2 s after 3 events"
    assert (
        report.detail
        == "interrupted after the first token (stalled: no event for 2 s after 3 events) after 3 events and 3.0 s; sent an error event"
    )


def test_comments_and_keep_alive_lines_do_not_move_the_idle_deadline():
    repair = machine(idle=2)
    repair.receive_data(sse(chunk("a")), now=0.0)
    for now in (0.5, 1.0, 1.5):
        assert repair.receive_data(COMMENT + b"\n", now=now) == COMMENT + b"\n"  # passed on at once
    assert repair.next_stall_check(1.5) == 2.0
    assert repair.receive_timer(2.0) is not None


def test_every_event_moves_the_idle_deadline():
    repair = machine(idle=2)
    for now in (0.0, 1.5, 3.0, 4.5):
        repair.receive_data(sse(chunk("a")), now=now)
        assert repair.receive_timer(now + 1.9) is None
    assert repair.next_stall_check(6.4) == 6.5


def test_first_token_deadline_counts_from_the_request_and_only_tokens_stop_it():
    repair = machine(idle=0, first_token=2)
    # The role chunk is an event but carries no token (its content is empty).
    repair.receive_data(sse(chunk(delta={"role": "assistant", "content": ""})), now=0.5)
    repair.receive_data(COMMENT, now=1.5)
    assert repair.next_stall_check(1.5) == 2.0
    ending = repair.receive_timer(2.0)
    message = data_events(ending.client_bytes)[0]["error"]["message"]
    assert message == "stream was interrupted: no token within 2 s of the request; the upstream stalled (finish_fix)"
    assert repair.report.interruption.before_first_token is True


def test_first_token_deadline_ends_with_the_first_token():
    repair = machine(idle=0, first_token=2)
    repair.receive_data(sse(chunk("a")), now=1.0)
    assert repair.next_stall_check(1.0) is None
    assert repair.receive_timer(100.0) is None


def test_a_long_first_token_deadline_does_not_delay_the_idle_one():
    # The lab's setting: idle 2 s, first token 600 s. The idle deadline starts with the first token,
    # which the caller cannot see: it is asked to look again within one idle timeout.
    repair = machine(idle=2, first_token=600)
    assert repair.next_stall_check(0.0) == 2.0
    repair.receive_data(sse(chunk("a")), now=0.1)
    assert repair.receive_timer(2.0) is None
    assert repair.next_stall_check(2.0) == pytest.approx(2.1)
    ending = repair.receive_timer(2.1)
    assert "no event for 2 s after 1 event" in data_events(ending.client_bytes)[0]["error"]["message"]


def test_while_the_first_token_deadline_runs_the_idle_deadline_waits_for_the_first_token():
    # The defaults' case: a role chunk at once, then a reasoning model thinks silently for minutes.
    # The idle deadline (2 s here) must not cut it; the first-token one (600 s) governs.
    repair = machine(idle=2, first_token=600)
    repair.receive_data(sse(chunk(delta={"role": "assistant", "content": ""})), now=0.1)
    for now in (2.1, 60.0, 180.0, 599.9):
        repair.receive_data(COMMENT, now=now)
        assert repair.receive_timer(now) is None and not repair.ended
        assert repair.next_stall_check(now) == pytest.approx(min(now + 2, 600.0))
    ending = repair.receive_timer(600.0)
    message = data_events(ending.client_bytes)[0]["error"]["message"]
    assert "no token within 600 s of the request" in message
    assert repair.report.interruption.before_first_token is True


def test_the_idle_deadline_starts_with_the_first_token_while_the_first_token_deadline_runs():
    repair = machine(idle=2, first_token=600)
    repair.receive_data(sse(chunk(delta={"role": "assistant", "content": ""})), now=0.1)
    repair.receive_data(sse(chunk("thought")), now=30.0)
    assert repair.receive_timer(31.9) is None
    assert repair.next_stall_check(31.9) == 32.0
    ending = repair.receive_timer(32.0)
    assert "no event for 2 s after 2 events" in data_events(ending.client_bytes)[0]["error"]["message"]


def test_with_the_first_token_deadline_off_the_idle_deadline_counts_from_the_first_event():
    repair = machine(idle=2, first_token=0)
    repair.receive_data(sse(chunk(delta={"role": "assistant", "content": ""})), now=0.5)
    assert repair.next_stall_check(0.5) == 2.5
    assert repair.receive_timer(2.4) is None
    ending = repair.receive_timer(2.5)
    assert "no event for 2 s after 1 event" in data_events(ending.client_bytes)[0]["error"]["message"]
    assert repair.report.interruption.before_first_token is True


def test_headers_then_silence_with_only_the_idle_deadline_never_stalls():
    # "once the first event arrived": before it, only the first-token deadline can fire.
    repair = machine(idle=2, first_token=0)
    for now in (2.0, 4.0, 6.0):
        assert repair.receive_timer(now) is None
        assert repair.next_stall_check(now) == now + 2


def test_deadlines_off_need_no_timer():
    repair = machine(idle=0, first_token=0)
    repair.receive_data(sse(chunk("a")), now=0.0)
    assert repair.next_stall_check(0.0) is None
    assert repair.receive_timer(1e9) is None


def test_no_deadline_after_done_or_an_error_event():
    for last in (b"[DONE]", {"error": {"message": "boom"}}):
        repair = machine(idle=2, first_token=2)
        repair.receive_data(sse(chunk("a"), chunk(finish_reason="stop"), last), now=0.0)
        assert repair.next_stall_check(0.0) is None
        assert repair.receive_timer(100.0) is None and not repair.ended


def test_an_http_error_response_has_no_deadline():
    repair = machine(idle=2, first_token=2, status=503)
    assert repair.next_stall_check(0.0) is None
    assert repair.receive_timer(100.0) is None


def test_on_cut_stop_finishes_a_stall_as_success_and_books_it_interrupted():
    repair = machine(idle=2, on_cut=OnCut.STOP)
    repair.receive_data(sse(chunk("a")), now=0.0)
    ending = repair.receive_timer(2.0)
    assert ending.end_response is True
    finishing, done = data_events(ending.client_bytes)
    assert finishing["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}] and done == "[DONE]"
    assert repair.report.verdict is Verdict.INTERRUPTED and "finished as success (on_cut=stop)" in repair.report.detail


def test_on_cut_pass_adds_nothing_and_lets_the_failure_through():
    repair = machine(idle=2, on_cut=OnCut.PASS)
    repair.receive_data(sse(chunk("a")) + b'data: {"hal', now=0.0)
    assert repair.receive_timer(2.0) == ClientEnding(b'data: {"hal', end_response=False)
    assert repair.report.verdict is Verdict.INTERRUPTED and repair.report.detail.endswith("; passed on unchanged")


def test_an_incomplete_event_held_at_a_stall_is_dropped():
    repair = machine(idle=2)
    repair.receive_data(sse(chunk("a")) + b'data: {"hal', now=0.0)
    ending = repair.receive_timer(2.0)
    assert ending.client_bytes.startswith(b'data: {"error"')
    assert repair.report.dropped_incomplete_bytes == len(b'data: {"hal')


def test_the_timer_after_the_end_is_misuse():
    repair = machine(idle=2)
    repair.receive_end(now=0.0)
    with pytest.raises(LocalProtocolError, match=r"^receive_timer\(\) called after the stream ended"):
        repair.receive_timer(10.0)
