"""Fuzz contracts of the repair core in the Messages and Responses dialects (hypothesis): any bytes,
any split points, any way to end (clean, failure, stall), any line ending.

Contracts (each test below checks one, in both dialects):

1. It never raises on what the upstream sent, and never reports an internal error.
2. Its output holds every complete upstream event unchanged, in order; the only other events are the
   ones the report lists in `injected` (Messages: `content_block_stop`, a finishing `message_delta`,
   `message_stop`, the `error` of a cut; Responses: the `error` and `response.failed` of a cut). An
   incomplete event left at a failure or a stall is dropped, never changed.
3. Unless the stream was passed through untouched (`skipped`: its first event is another dialect's),
   the output ends in the dialect's terminal event or in exactly one injected error sequence:
   Messages, a `message_stop` after a non-empty `stop_reason`, or an `error` event (the upstream's,
   or the one finish_fix sent); Responses, `response.completed`, `response.incomplete`,
   `response.failed` or an `error` (bare or not) from the upstream, or finish_fix's `error` then
   `response.failed`, after which nothing is left half-framed, but for a Responses upstream's own
   `data: [DONE]` that came before any terminal event: finish_fix's two events go before it (both
   SDKs stop reading at it), and it and whatever follows pass as sent. After the upstream's own
   terminal event later bytes pass as sent: a client stops reading there.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from finishline import Dialect, Event, EventFramer, OnCut, StreamRepair, Verdict
from labs.worker.frames import sse_frame
from tests.test_core_fuzz import SETTINGS, assert_upstream_events_lead_unchanged
from tests.test_core_fuzz import run as fuzz_run

DIALECTS = st.sampled_from([Dialect.MESSAGES, Dialect.RESPONSES])
ENDINGS = [b"\n", b"\r\n", b"\r"]


def _frames(kind: str, **fields) -> list[bytes]:
    """The frame in each line ending, with and without its `event:` line."""
    data = {"type": kind, **fields}
    return [sse_frame(data, event=kind, line_ending=ending) for ending in ENDINGS] + [sse_frame(data)]


_MESSAGES = [
    *_frames(
        "message_start", message={"id": "msg_1", "type": "message", "model": "m", "content": [], "usage": {"output_tokens": 1}}
    ),
    *_frames("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    *_frames("content_block_start", index=1, content_block={"type": "tool_use", "id": "t", "name": "f", "input": {}}),
    *_frames("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
    *_frames("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"a'}),
    *_frames("content_block_stop", index=0),
    *_frames("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 3}),
    *_frames("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 2}),
    *_frames("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": " the"}, usage={"output_tokens": 2}),
    *_frames("message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None}, usage={"output_tokens": 3}),
    *_frames("message_delta", delta={"stop_reason": None, "stop_sequence": None}, usage={"output_tokens": 4}),
    *_frames("message_delta", delta={"stop_reason": ""}),
    *_frames("message_stop"),
    *_frames("ping"),
    *_frames("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    b"event: error\ndata: not json\n\n",
    sse_frame(b"[DONE]"),
    sse_frame({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}),
]
_RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
_RESPONSES = [
    *_frames("response.created", sequence_number=0, response=_RESPONSE),
    *_frames("response.in_progress", sequence_number=1, response=_RESPONSE),
    *_frames("response.output_text.delta", sequence_number=5, item_id="msg_1", output_index=0, content_index=0, delta="Hi"),
    *_frames("response.output_text.delta", sequence_number=6, item_id="msg_1", output_index=0, content_index=0, delta=""),
    *_frames("response.reasoning_text.delta", sequence_number=7, delta="hm"),
    *_frames("response.function_call_arguments.delta", sequence_number=8, delta="{"),
    *_frames("response.completed", sequence_number=9, response={**_RESPONSE, "status": "completed"}),
    # llama.cpp's: no indexes on any event, `completed` at the limit (the fuzz's request allows 3).
    *_frames("response.output_item.added", item={"id": "msg_2", "type": "message", "content": []}),
    *_frames("response.content_part.added", item_id="msg_2", part={"type": "output_text", "text": ""}),
    *_frames("response.output_text.delta", item_id="msg_2", delta="Hi"),
    *_frames("response.output_item.done", item={"id": "msg_2", "type": "message", "content": []}),
    *_frames("response.completed", response={**_RESPONSE, "status": "completed", "usage": {"output_tokens": 3}}),
    *_frames(
        "response.completed", sequence_number=9, response={**_RESPONSE, "status": "completed", "usage": {"output_tokens": 2}}
    ),
    *_frames("response.incomplete", sequence_number=9, response={**_RESPONSE, "status": "incomplete"}),
    *_frames(
        "response.failed", sequence_number=9, response={**_RESPONSE, "status": "failed", "error": {"code": "x", "message": "y"}}
    ),
    *_frames("error", sequence_number=9, code="server_error", message="boom", param=None),
    sse_frame({"error": {"message": "boom", "type": "server_error"}}),
    sse_frame(b"[DONE]"),
    *_frames("message_start", message={"id": "m"}),
]
_NOISE = [b": keep-alive\n\n", b"\n", b"\r", b"data: ", b"event: ", b"data:{", b"\xef\xbb\xbf"]
UPSTREAM = {
    dialect: st.lists(st.one_of(st.binary(max_size=30), st.sampled_from(meaningful + _NOISE)), max_size=12).map(b"".join)
    for dialect, meaningful in ((Dialect.MESSAGES, _MESSAGES), (Dialect.RESPONSES, _RESPONSES))
}


def run(data, *, on_cut: OnCut) -> tuple[bytes, StreamRepair, bytes, Dialect]:
    """The Chat contracts' driver (`tests.test_core_fuzz.run`) with a drawn dialect and its streams.
    Returns (upstream, machine, client output, dialect)."""
    dialect = data.draw(DIALECTS)
    upstream, repair, out, _ = fuzz_run(data, on_cut=on_cut, dialect=dialect, upstream=UPSTREAM[dialect])
    return upstream, repair, out, dialect


def _parsed(data: bytes | None):
    try:
        return json.loads(data) if data is not None else None
    except ValueError:
        return None


def _kind(event) -> str | None:
    parsed = _parsed(event.data)
    kind = parsed.get("type") if isinstance(parsed, dict) else None
    if isinstance(kind, str):
        return kind
    if isinstance(parsed, dict) and parsed.get("error") is not None:
        return "bare-error"
    return event.event_type.decode("utf-8", "replace") if event.event_type else None


def _is_ours(event) -> bool:
    return b"(finish_fix)" in (event.data or b"")


def injected_kind(event) -> str | None:
    """Which of the report's `injected` kinds `event` is, if it is one finish_fix writes."""
    kind = _kind(event)
    parsed = _parsed(event.data)
    if kind == "error" and _is_ours(event):
        return "error_event"
    if kind == "response.failed" and _is_ours(event):
        return "response.failed"
    if kind == "message_delta" and isinstance(parsed, dict) and set(parsed) == {"type", "delta", "usage"}:
        return "finish"
    if kind in ("message_stop", "content_block_stop") and event.event_type is not None:
        return kind
    return None


def _client_events(out: bytes) -> tuple[list[Event], Event | None]:
    framer = EventFramer()
    events = [event for event in framer.receive_data(out) if event.data is not None]
    return events, framer.receive_end()


@given(st.data())
@SETTINGS
def test_contract_1_never_raises_and_never_falls_back(data):
    _, repair, _, _ = run(data, on_cut=data.draw(st.sampled_from(list(OnCut))))
    assert repair.report.internal_error is None, repair.report.internal_error


@given(st.data())
@SETTINGS
def test_contract_2_every_complete_upstream_event_reaches_the_client_unchanged(data):
    upstream, repair, out, _ = run(data, on_cut=data.draw(st.sampled_from(list(OnCut))))
    assert_upstream_events_lead_unchanged(upstream, repair, out, injected_kind)


_MESSAGES_ENDS = {"message_stop", "error"}
_RESPONSES_ENDS = {"response.completed", "response.incomplete", "response.failed", "error", "bare-error"}


@given(st.data())
@SETTINGS
def test_contract_3_ends_in_the_terminal_event_or_exactly_one_error_sequence(data):
    upstream, repair, out, dialect = run(data, on_cut=data.draw(st.sampled_from([OnCut.ERROR, OnCut.STOP])))
    if repair.report.verdict is Verdict.SKIPPED:
        assert out == upstream  # another dialect's stream, or an event too big to hold: untouched
        return
    events, leftover = _client_events(out)
    ends = _MESSAGES_ENDS if dialect is Dialect.MESSAGES else _RESPONSES_ENDS
    position = next((number for number, event in enumerate(events) if _kind(event) in ends), None)
    assert position is not None, f"no terminal event: {out!r}"
    ours = [number for number, event in enumerate(events) if injected_kind(event) == "error_event"]
    assert len(ours) <= 1, out
    if ours:
        # finish_fix's error sequence is the end of everything it sent: the end of the stream, or
        # right before a Responses upstream's own `[DONE]`, which passes with what follows it.
        sequence = 1 if dialect is Dialect.MESSAGES else 2
        after = events[ours[0] + sequence :]
        assert ours[0] == position, out
        if dialect is Dialect.RESPONSES:
            assert injected_kind(events[ours[0] + 1]) == "response.failed", out
            if after:
                assert (after[0].data or b"").startswith(b"[DONE]"), out
                return
        assert not after and leftover is None, out
        return
    if _kind(events[position]) == "message_stop":
        reasons = [
            (_parsed(event.data).get("delta") or {}).get("stop_reason")
            for event in events[:position]
            if _kind(event) == "message_delta"
        ]
        assert any(isinstance(reason, str) and reason for reason in reasons), out
    # The upstream's own terminal event ended it: what follows passes as sent (a client stops there).
