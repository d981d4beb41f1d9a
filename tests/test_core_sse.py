"""The SSE framer: exact bytes, WHATWG line endings, any chunking."""

from __future__ import annotations

import pytest

from finishline import EventFramer, LocalProtocolError
from tests.feeding import CHUNKINGS, chunk, run, split, sse


def frame(data: bytes, chunking: str):
    framer = EventFramer()
    events = [event for piece in split(data, chunking) for event in framer.receive_data(piece)]
    return events, framer.receive_end(), framer


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize(
    ("stream", "expected_data"),
    [
        (b"data: a\n\n", [b"a"]),
        (b"data:a\r\n\r\n", [b"a"]),
        (b"data: a\r\rdata: b\r\r", [b"a", b"b"]),
        (b"data: a\ndata: b\n\n", [b"a\nb"]),
        (b": comment\n\ndata: x\n\n", [None, b"x"]),
        (b"event: error\nid: 1\nretry: 5\ndata: x\n\n", [b"x"]),
        (b"\xef\xbb\xbfdata: bom\n\n", [b"bom"]),
        (b"data\n\n", [b""]),
        (b"data:  two spaces\n\n", [b" two spaces"]),
    ],
)
def test_events_and_their_data(chunking, stream, expected_data):
    events, leftover, _ = frame(stream, chunking)
    assert b"".join(event.raw for event in events) == stream
    assert [event.data for event in events if event.raw.strip(b"\r\n")] == expected_data
    assert leftover is None


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_crlf_split_between_cr_and_lf_keeps_every_byte(chunking):
    stream = b"data: a\r\n\r\ndata: b\r\n\r\n"
    events, leftover, framer = frame(stream, chunking)
    assert b"".join(event.raw for event in events) == stream
    assert [event.data for event in events if event.data is not None] == [b"a", b"b"]
    assert framer.line_ending == b"\r\n"
    assert leftover is None


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_event_type_is_read(chunking):
    events, _, _ = frame(b"event: error\ndata: boom\n\n", chunking)
    assert events[0].event_type == b"error"


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_leftover_at_the_end_is_an_incomplete_event(chunking):
    events, leftover, _ = frame(b'data: a\n\ndata: {"b', chunking)
    assert [event.data for event in events] == [b"a"]
    assert leftover is not None and not leftover.complete and leftover.raw == b'data: {"b'


def test_a_10_mb_event_in_pieces_of_64_kb():
    big = sse(chunk("x" * 10_000_000))
    upstream = big + sse(chunk(finish_reason="stop"), b"[DONE]")
    repair_out = []
    events, _, _ = frame(big, "whole")
    assert events[0].raw == big
    from finishline import StreamRepair

    repair = StreamRepair()
    for start in range(0, len(upstream), 65536):
        repair_out.append(repair.receive_data(upstream[start : start + 65536]))
    repair_out.append(repair.receive_end())
    assert b"".join(repair_out) == upstream


def test_many_events_in_one_8_mb_chunk():
    events = [chunk(f"token {i}") for i in range(60_000)]
    upstream = sse(*events, chunk(finish_reason="stop"), b"[DONE]")
    assert len(upstream) > 8_000_000
    out, repair = run(upstream, "whole")
    assert out == upstream
    assert repair.report.events == 60_002


def test_misuse_is_reported_with_what_was_seen():
    framer = EventFramer()
    framer.receive_end()
    with pytest.raises(LocalProtocolError, match=r"receive_data\(\) got 3 bytes after receive_end\(\)"):
        framer.receive_data(b"abc")
    with pytest.raises(LocalProtocolError, match="receive_end\\(\\) called twice"):
        framer.receive_end()


@pytest.mark.parametrize(
    ("pieces", "idle"),
    [
        ([], False),  # nothing seen yet: a byte order mark may still come
        ([b"data: a\n\n"], True),
        ([b"data: a\n\n", b"data: b"], False),  # an incomplete event is held
        ([b"data: a\n\n", b"data: b\n"], False),
        ([b"data: a\r\r"], False),  # the LF that may follow the last CR belongs to it
        ([b"data: a\r\r", b"\n"], True),
        ([b"data: a\r\n\r\n"], True),
    ],
)
def test_idle_says_a_whole_event_piece_would_frame_as_itself(pieces, idle):
    framer = EventFramer()
    for piece in pieces:
        framer.receive_data(piece)
    assert framer.idle is idle
    if idle:  # what the repair's fast path relies on
        assert [event.raw for event in framer.receive_data(b"data: x\n\n")] == [b"data: x\n\n"]


def test_an_ended_framer_is_not_idle():
    framer = EventFramer()
    framer.receive_data(b"data: a\n\n")
    framer.receive_end()
    assert not framer.idle


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_split_events_cuts_after_each_blank_line_in_the_streams_ending(ending):
    framer = EventFramer()
    assert framer.split_events(b"data: 1" + ending * 2 + b"data: 2" + ending * 2) is None  # ending not known yet
    framer.receive_data(b"data: 0" + ending * 2)
    one, two, part = b"data: 1" + ending * 2, b"event: x" + ending + b"data: 2" + ending * 2, b"data: 3"
    assert framer.split_events(one) is None and framer.split_events(part) is None
    assert framer.split_events(one + two) == [one, two]
    assert framer.split_events(one + two + part) == [one, two, part]
    # A guess, not framing: extra blank lines stay with what follows, and the parts are the input.
    odd = one + ending + two
    assert b"".join(framer.split_events(odd) or []) == odd


def test_split_events_leaves_lone_cr_streams_whole():
    framer = EventFramer()
    framer.receive_data(b"data: 0\r\r")
    assert framer.split_events(b"data: 1\r\rdata: 2\r\r") is None
