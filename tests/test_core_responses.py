"""The OpenAI Responses rules R1-R5 (docs/repair-rules.md, "OpenAI Responses"), one test per rule, every stream fed whole,
byte by byte and at random splits. Frames are written by the worker's one SSE frame writer."""

from __future__ import annotations

import json

import pytest

from finishline import Dialect, OnCut, RepairPolicy, StreamRepair, Verdict, stream_dialect, transcribe_stream
from labs.worker.frames import sse_frame
from tests.feeding import CHUNKINGS, complete_events, run

RESPONSES = Dialect.RESPONSES
RESPONSE = {"id": "resp_lab", "object": "response", "created_at": 1764000000, "status": "in_progress", "model": "m", "output": []}


class Stream:
    """Builds a Responses stream with increasing sequence numbers."""

    def __init__(self, ending: bytes = b"\n") -> None:
        self.number = 0
        self.ending = ending
        self.bytes = b""

    def add(self, kind: str, **fields) -> Stream:
        self.bytes += sse_frame({"type": kind, "sequence_number": self.number, **fields}, event=kind, line_ending=self.ending)
        self.number += 1
        return self

    def opening(self) -> Stream:
        self.add("response.created", response=RESPONSE).add("response.in_progress", response=RESPONSE)
        return self.add(
            "response.output_item.added",
            output_index=0,
            item={"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []},
        )

    def text(self, *deltas: str) -> Stream:
        for delta in deltas:
            self.add("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta=delta, logprobs=[])
        return self

    def completed(self, kind: str = "response.completed", status: str = "completed") -> Stream:
        self.add("response.output_text.done", item_id="msg_1", output_index=0, content_index=0, text="done", logprobs=[])
        return self.add(kind, response={**RESPONSE, "status": status})


def events_of(stream: bytes) -> list:
    return [data if data.startswith("[DONE]") else json.loads(data) for data in complete_events(stream)]


def feed(upstream: bytes, chunking: str, **kwargs) -> tuple[bytes, StreamRepair]:
    return run(upstream, chunking, dialect=RESPONSES, **kwargs)


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
@pytest.mark.parametrize(
    ("terminal", "status"),
    [
        ("response.completed", "completed"),
        ("response.incomplete", "incomplete"),
        ("response.failed", "failed"),
    ],
)
def test_r1_a_well_formed_stream_is_byte_identical(chunking, ending, terminal, status):
    stream = Stream(ending).opening()
    stream.add("response.output_item.added", output_index=1, item={"id": "rs_1", "type": "reasoning", "summary": []})
    stream.add("response.reasoning_summary_text.delta", item_id="rs_1", output_index=1, summary_index=0, delta="Think")
    stream.add("response.function_call_arguments.delta", item_id="fc_1", output_index=2, delta='{"city"')
    stream.add("response.some_future_event", note="unknown events pass")
    upstream = stream.text("Hel", "lo").completed(terminal, status).bytes
    for tail in (b"", sse_frame(b"[DONE]", line_ending=ending)):
        out, repair = feed(upstream + tail, chunking)
        assert out == upstream + tail
        expected = Verdict.UPSTREAM_ERROR if terminal == "response.failed" else Verdict.CLEAN
        assert repair.report.verdict is expected and repair.report.dialect is RESPONSES


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r2_a_stream_is_never_completed_by_finish_fix_even_with_on_cut_stop(chunking):
    upstream = Stream().opening().text("Hi").bytes
    for policy in (RepairPolicy(), RepairPolicy(on_cut=OnCut.STOP)):
        out, repair = feed(upstream, chunking, policy=policy)
        assert b"response.completed" not in out
        assert [event["type"] for event in events_of(out[len(upstream) :])] == ["error", "response.failed"]
        assert repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_r3_a_cut_ends_in_an_error_then_response_failed(chunking, end):
    stream = Stream().opening().text("Hel", "lo")
    out, repair = feed(stream.bytes, chunking, end=end)
    assert out.startswith(stream.bytes)
    injected = out[len(stream.bytes) :]
    assert injected.startswith(b"event: error\ndata: ")
    assert b"\n\nevent: response.failed\ndata: " in injected
    error, failed = events_of(injected)
    message = error["message"]
    assert message.startswith("stream was interrupted: ") and "without a terminal event" in message
    assert error == {
        "type": "error",
        "code": "stream_interrupted",
        "message": message,
        "param": None,
        "sequence_number": stream.number,
        "error": {"type": "server_error", "code": "stream_interrupted", "message": message, "param": None},
    }
    assert failed["sequence_number"] == stream.number + 1
    assert failed["response"] == {**RESPONSE, "status": "failed", "error": {"code": "server_error", "message": message}}
    assert repair.report.verdict is Verdict.INTERRUPTED
    how = "clean end without a terminal event" if end == "clean" else "transport error: peer reset"
    assert how in repair.report.detail


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r3_a_cut_before_anything_names_no_response_but_still_fails_it(chunking):
    out, repair = feed(b"", chunking)
    error, failed = events_of(out)
    assert (error["sequence_number"], failed["sequence_number"]) == (0, 1)
    assert failed["response"]["status"] == "failed" and repair.report.interruption.before_first_token


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r3_ollamas_clean_close_after_a_reasoning_delta_is_a_cut(chunking):
    stream = Stream().opening()
    stream.add("response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta="hmm")
    out, repair = feed(stream.bytes, chunking)
    assert repair.report.verdict is Verdict.INTERRUPTED and not repair.report.interruption.before_first_token
    assert events_of(out)[-1]["type"] == "response.failed"


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
@pytest.mark.parametrize(
    "error",
    [
        sse_frame(
            {"type": "error", "code": "server_error", "message": "boom", "param": None, "sequence_number": 5}, event="error"
        ),
        sse_frame(
            {"type": "error", "sequence_number": 5, "error": {"type": "server_error", "code": "server_error", "message": "boom"}},
            event="error",
        ),
        sse_frame(
            {
                "type": "response.failed",
                "sequence_number": 5,
                "response": {**RESPONSE, "status": "failed", "error": {"code": "server_error", "message": "boom"}},
            },
            event="response.failed",
        ),
        sse_frame({"error": {"message": "boom", "type": "server_error", "code": "server_error"}}),  # vLLM's bare frame
    ],
)
def test_r4_an_upstream_error_passes_and_nothing_is_injected(chunking, end, error):
    upstream = Stream().opening().text("Hi").bytes + error
    out, repair = feed(upstream, chunking, end=end)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR
    assert repair.report.detail == "upstream_error: error event (server_error)"
    assert repair.report.upstream_error_message == "boom"


@pytest.mark.parametrize(
    "kind",
    [
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    ],
)
def test_r5_the_first_token_is_the_first_text_reasoning_or_arguments_delta(kind):
    stream = Stream().opening().add(kind, item_id="x", output_index=0, delta="t")
    _, repair = feed(stream.bytes, "whole")
    assert repair.report.interruption.before_first_token is False


def test_r5_the_lifecycle_events_are_no_token_and_the_deadline_runs():
    repair = StreamRepair(
        dialect=RESPONSES, policy=RepairPolicy(idle_timeout=5, first_token_timeout=10), started_at=0.0, sent_at=0.0
    )
    repair.receive_data(Stream().opening().bytes, now=1.0)
    ending = repair.receive_timer(10.0)
    assert ending is not None and b"no token within 10 s" in ending.client_bytes
    assert b"event: response.failed" in ending.client_bytes


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_a_messages_stream_on_a_responses_path_passes_untouched(chunking):
    upstream = sse_frame({"type": "message_start", "message": {"id": "m"}}, event="message_start")
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.SKIPPED
    assert "the first event is Anthropic Messages, not OpenAI Responses" in repair.report.detail


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("odd_type", [["response.output_text.delta"], {"type": "response.output_text.delta"}])
def test_a_type_that_is_a_list_or_an_object_is_data(chunking, odd_type):
    # Unhashable: the fast path's check of the type against its table raised TypeError, and the
    # stream was passed through as an internal error. The `event:` line still names the delta.
    stream = Stream().opening().add("response.output_text.delta", type=odd_type, item_id="msg_1", output_index=0, delta="Hi")
    out, repair = feed(stream.completed().bytes, chunking)
    assert repair.report.internal_error is None
    assert out == stream.bytes and repair.report.verdict is Verdict.CLEAN


def test_the_transcript_numbers_the_events_and_reassembles_each_item():
    stream = Stream().opening().text("Hel", "lo").completed().bytes + b"data: {\xff\n\n"
    assert stream_dialect(stream) is RESPONSES
    text = transcribe_stream(stream, RESPONSES)
    assert "    4 [response.output_text.delta] seq 3 response.output_text.delta 'Hel'" in text
    assert "--- item 0: message\nHello" in text
    assert "not JSON" in text


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_r3_a_done_before_any_terminal_event_gets_the_error_and_response_failed_before_it(chunking, end):
    # A server that ends every dialect the Chat way (`data: [DONE]`) and sends no terminal event
    # (the lab worker's `finish=omitted`): both SDKs stop reading at `[DONE]`, so R3's two events go
    # before it, and the stream is over there (its clean end or a later failure adds nothing).
    stream = Stream().opening().text("Hel", "lo")
    done = sse_frame(b"[DONE]")
    out, repair = feed(stream.bytes + done, chunking, end=end)
    assert out.startswith(stream.bytes) and out.endswith(done)
    error, failed, last = events_of(out[len(stream.bytes) :])
    assert (error["type"], failed["type"], last) == ("error", "response.failed", "[DONE]")
    assert (error["sequence_number"], failed["sequence_number"]) == (stream.number, stream.number + 1)
    assert failed["response"]["id"] == RESPONSE["id"]
    assert repair.report.verdict is Verdict.INTERRUPTED
    assert "clean end without a terminal event" in repair.report.detail
    assert repair.report.malformed_events == 0


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r3_a_done_with_on_cut_pass_is_passed_on_and_still_booked_interrupted(chunking):
    stream = Stream().opening().text("Hi")
    upstream = stream.bytes + sse_frame(b"[DONE]")
    out, repair = feed(upstream, chunking, policy=RepairPolicy(on_cut=OnCut.PASS))
    assert out == upstream
    assert repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("name", [None, b"\x00", b"message"])
def test_r4_a_bare_error_frame_is_the_upstreams_error_under_any_event_name(chunking, name):
    # Found by the fuzz contracts: a `{"error": ...}` frame under an odd `event:` name was read as an
    # unknown event, and the stream's clean end then got finish_fix's cut events after it.
    frame = sse_frame({"error": {"message": "boom", "type": "server_error"}}, event=name.decode() if name else None)
    upstream = Stream().opening().text("Hi").bytes + frame
    out, repair = feed(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.UPSTREAM_ERROR
