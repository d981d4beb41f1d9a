"""`finishline.StreamErrorWriter`: the error ending finish_fix writes for a cut (rules C6, M4, R3, G2),
for a relay that is not finish_fix (the lab's hub), in the writer's words. Every stream is fed
whole, byte by byte and at random splits."""

from __future__ import annotations

import json

import pytest

from finishline import Dialect, EventFramer, StreamErrorWriter
from labs.dialects import LAB_DIALECTS
from tests.dialect_streams import messages_stream, responses_stream
from tests.feeding import CHUNKINGS, complete_events, run, split
from tests.gemini_streams import gemini_chunks, sse_body

MESSAGE = "agent disconnected mid-request"
CODE = "worker_disconnected"


def written(dialect: Dialect, upstream: bytes, chunking: str) -> bytes:
    writer = StreamErrorWriter(dialect)
    for piece in split(upstream, chunking):
        writer.receive_data(piece)
    return writer.error_frames(MESSAGE, code=CODE)


def frames_of(data: bytes) -> list[tuple[str | None, dict]]:
    """(the `event:` name, the parsed data) of each frame."""
    return [
        (event.event_type.decode() if event.event_type else None, json.loads(event.data))
        for event in EventFramer().receive_data(data)
        if event.data is not None
    ]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_chat_is_one_data_only_error_event_with_the_writers_code(chunking):
    upstream = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    assert written(Dialect.CHAT, upstream, chunking) == (
        b'data: {"error":{"message":"agent disconnected mid-request","type":"server_error","code":"worker_disconnected"}}\n\n'
    )


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_gemini_is_googles_error_frame_with_error_first_and_a_numeric_code(chunking):
    upstream = sse_body(gemini_chunks(["a", "b"], finish=None))
    assert written(Dialect.GEMINI, upstream, chunking) == (
        b'data: {"error":{"code":503,"message":"agent disconnected mid-request","status":"UNAVAILABLE"}}\n\n'
    )


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_messages_is_event_error_with_anthropics_api_error_and_nothing_after_it(chunking):
    upstream = b"".join(messages_stream(["a", "b"], closed=False))
    assert frames_of(written(Dialect.MESSAGES, upstream, chunking)) == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": MESSAGE}})
    ]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_responses_is_error_then_response_failed_continuing_the_streams_id_and_numbers(chunking):
    events = responses_stream(["a", "b", "c"], closed=False)
    upstream = b"".join(events)
    last_number = json.loads(complete_events(events[-1])[0])["sequence_number"]
    created = json.loads(complete_events(events[0])[0])["response"]
    frames = frames_of(written(Dialect.RESPONSES, upstream, chunking))
    assert [name for name, _ in frames] == ["error", "response.failed"]
    (_, error), (_, failed) = frames
    assert error == {
        "type": "error",
        "code": CODE,
        "message": MESSAGE,
        "param": None,
        "sequence_number": last_number + 1,
        "error": {"type": "server_error", "code": CODE, "message": MESSAGE, "param": None},
    }
    assert failed["sequence_number"] == last_number + 2
    assert failed["response"]["id"] == created["id"]
    assert (failed["response"]["status"], failed["response"]["error"]) == ("failed", {"code": "server_error", "message": MESSAGE})


def test_responses_before_any_event_starts_the_numbers_at_zero():
    frames = frames_of(StreamErrorWriter(Dialect.RESPONSES).error_frames(MESSAGE, code=CODE))
    assert [(name, data["sequence_number"]) for name, data in frames] == [("error", 0), ("response.failed", 1)]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_the_ending_is_written_in_the_streams_own_line_endings(dialect):
    upstream = {
        Dialect.CHAT: b'data: {"choices":[]}\r\n\r\n',
        Dialect.MESSAGES: b"".join(messages_stream(["a"], closed=False, line_ending=b"\r\n")),
        Dialect.RESPONSES: b"".join(responses_stream(["a"], closed=False, line_ending=b"\r\n")),
        Dialect.GEMINI: sse_body(gemini_chunks(["a"], finish=None), ending=b"\r\n"),
    }[dialect]
    ending = written(dialect, upstream, "whole")
    assert ending.endswith(b"\r\n\r\n") and b"\n" not in ending.replace(b"\r\n", b"")


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_a_body_that_is_no_stream_is_read_without_raising(dialect):
    writer = StreamErrorWriter(dialect)
    for piece in (b'{"not": "sse"', b"\xff\xfe", b"data: {not json}\n\n", b"data: [1, 2]\n\n"):
        writer.receive_data(piece)
    assert frames_of(writer.error_frames(MESSAGE, code=CODE))


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_the_writers_frames_are_finish_fixs_own_for_the_same_cut(dialect):
    """One home per dialect's error ending: finish_fix's cut frames, with its message and code,
    are byte for byte what the writer gives with them."""
    upstream = {
        Dialect.CHAT: b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
        Dialect.MESSAGES: b"".join(messages_stream(["a", "b"], closed=False)),
        Dialect.RESPONSES: b"".join(responses_stream(["a", "b"], closed=False)),
        Dialect.GEMINI: sse_body(gemini_chunks(["a", "b"], finish=None)),
    }[dialect]
    client, repair = run(upstream, end="failure", dialect=dialect)
    ending = client[len(upstream) :]
    first = frames_of(ending)[0][1]
    message = first["error"]["message"]
    code = first.get("code", first["error"].get("code", ""))
    writer = StreamErrorWriter(dialect)
    writer.receive_data(upstream)
    assert writer.error_frames(message, code=code) == ending


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("line_ending", [b"\n", b"\r\n"])
@pytest.mark.parametrize("where", ["mid-line", "after a line"])
@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_a_cut_inside_an_event_is_ended_before_the_error_frames(dialect, where, line_ending, chunking):
    """A relay passing bytes on as they come sent half an event: the ending first closes that event,
    so the client reads the partial event, then the error frames whole (review C1)."""
    whole = {
        Dialect.CHAT: b"".join(
            b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}' % text + line_ending * 2 for text in (b"a", b"b")
        ),
        Dialect.MESSAGES: b"".join(messages_stream(["a", "b"], closed=False, line_ending=line_ending)),
        Dialect.RESPONSES: b"".join(responses_stream(["a", "b"], closed=False, line_ending=line_ending)),
        Dialect.GEMINI: sse_body(gemini_chunks(["a", "b"], finish=None), ending=line_ending),
    }[dialect]
    last_event = whole[: -len(line_ending)].rfind(line_ending * 2) + 2 * len(line_ending)
    first_line_end = whole.index(line_ending, last_event) + len(line_ending)
    cut = whole[: first_line_end - 5] if where == "mid-line" else whole[:first_line_end]
    framer = EventFramer()
    events = framer.receive_data(cut + written(dialect, cut, chunking))
    assert framer.receive_end() is None  # nothing left half-read
    ending = written(dialect, whole[:last_event], "whole")  # the frames after the whole events only
    expected = [event.raw for event in EventFramer().receive_data(ending)]
    assert [event.raw for event in events[-len(expected) :]] == expected
    assert events[-len(expected) - 1].raw.startswith(cut[last_event:])  # the partial event, ended
