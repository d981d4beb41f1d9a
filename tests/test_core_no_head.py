"""No response head: the first-token deadline before there is a stream (`head_deadline`) and the
answer the client gets when it passes (`answer_no_head`: HTTP 504 and the dialect's error body),
with its books. Times are plain numbers (the core has no clock)."""

from __future__ import annotations

import json

import pytest

from finishline import (
    NO_HEAD_STATUS,
    CutCause,
    Dialect,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    Verdict,
    answer_no_head,
    head_deadline,
)
from tests.feeding import chunk, data_events, sse

MESSAGE = "no response head within 2 s of the request; the upstream did not answer (finish_fix)"


def test_the_head_deadline_is_one_first_token_timeout_after_the_request_went_upstream():
    assert head_deadline(RepairPolicy(first_token_timeout=2, idle_timeout=120), sent_at=10.0) == 12.0


def test_no_head_deadline_when_the_first_token_deadline_is_off():
    assert head_deadline(RepairPolicy(first_token_timeout=0, idle_timeout=120), sent_at=10.0) is None


@pytest.mark.parametrize(
    ("dialect", "body"),
    [
        (
            Dialect.CHAT,
            {"error": {"message": MESSAGE, "type": "server_error", "param": None, "code": "no_response_head"}},
        ),
        (
            Dialect.RESPONSES,
            {"error": {"message": MESSAGE, "type": "server_error", "param": None, "code": "no_response_head"}},
        ),
        (Dialect.MESSAGES, {"type": "error", "error": {"type": "timeout_error", "message": MESSAGE}}),
        # Google's own error body, its `code` the response's status (rule G6's shape).
        (Dialect.GEMINI, {"error": {"code": 504, "message": MESSAGE, "status": "DEADLINE_EXCEEDED"}}),
    ],
)
def test_the_answer_is_a_504_with_the_dialects_error_body(dialect, body):
    answer = answer_no_head(dialect=dialect, timeout=2)
    assert answer.status == NO_HEAD_STATUS == 504
    assert answer.content_type == "application/json"
    assert json.loads(answer.body) == body


def test_the_books_say_interrupted_before_the_head_with_its_cause():
    answer = answer_no_head(dialect=Dialect.MESSAGES, timeout=2.5, request=RequestFacts(model="m1", stream=True), elapsed=2.7)
    booking = answer.booking
    assert booking.verdict is Verdict.INTERRUPTED and booking.cause is CutCause.NO_RESPONSE_HEAD
    assert (
        booking.detail == "interrupted before the response head (no response head within 2.5 s of the request); answered HTTP 504"
    )
    assert (booking.model, booking.dialect, booking.duration) == ("m1", Dialect.MESSAGES, 2.7)
    assert (booking.events, booking.upstream_bytes, booking.client_bytes) == (0, 0, len(answer.body))
    assert booking.to_json()["verdict"] == "interrupted" and booking.injected == ()


def test_a_head_that_came_does_not_restart_the_first_token_deadline():
    # Sent at 1, head at 2.5 (after most of the 2 s): the first token is due at 3, not at 4.5.
    repair = StreamRepair(policy=RepairPolicy(first_token_timeout=2), started_at=0.0, sent_at=1.0)
    repair.receive_data(sse(chunk(delta={"role": "assistant", "content": ""})), now=2.5)
    assert repair.next_stall_check(2.5) == 3.0
    assert repair.receive_timer(2.9) is None
    ending = repair.receive_timer(3.0)
    assert ending is not None
    assert "no token within 2 s of the request" in data_events(ending.client_bytes)[0]["error"]["message"]


def test_without_a_send_time_the_first_token_deadline_counts_from_the_start():
    repair = StreamRepair(policy=RepairPolicy(first_token_timeout=2), started_at=5.0)
    assert repair.next_stall_check(5.0) == 7.0
