"""The benchmark's streams (`tests/bench.py`): what each dialect's long stream is, where it is served,
and the check that a proxy passed it on untouched. Speed is never asserted here."""

from __future__ import annotations

import json
import re

import pytest

from finishline import Dialect, EventFramer, StreamRepair
from finishline import _repair as finishline_repair
from finishline._rules import DIALECT_FRAMERS
from finishline._steady import match_plain_text
from finishline.addon.options import PATH_OPTIONS
from tests.bench import API, BENCH_DIALECTS, Route, UpstreamBody, dialect_stream, read_stream, request_facts
from tests.upstream_server import Script, UpstreamServer


def _dialect_finish_fix_reads(path: str) -> Dialect | None:
    """The dialect finish_fix's default path options give `path`: the first that matches, in the
    order the addon tries them (`PATH_OPTIONS`), on the path without its query, as the addon reads it."""
    path = path.partition("?")[0]
    for dialect, (_, default) in PATH_OPTIONS.items():
        if re.search(default, path):
            return dialect
    return None


@pytest.mark.parametrize("dialect", list(BENCH_DIALECTS))
def test_each_stream_is_served_where_finish_fix_reads_it_in_its_dialect(dialect):
    with UpstreamServer() as upstream:
        prefix = upstream.route(Script(pieces=dialect_stream(dialect, 3)))
    assert _dialect_finish_fix_reads(f"{prefix}{API[dialect][0]}") is dialect
    assert request_facts(dialect).model == "bench"
    assert request_facts(dialect).stream and not request_facts(dialect).json_array_stream  # (Gemini: alt=sse)


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES, Dialect.GEMINI])
def test_a_dialect_stream_is_its_builders_healthy_stream_of_n_text_deltas(dialect):
    pieces = dialect_stream(dialect, 50)
    # One `data:` line per piece, so the bench's count of `data: ` marks is the count of events.
    assert all(piece.count(b"data: ") == 1 and piece.endswith((b"\n\n", b"\r\n\r\n")) for piece in pieces)
    deltas = [
        piece
        for piece in pieces
        if b'"text_delta"' in piece or b"event: response.output_text.delta\n" in piece or b'"parts":[{"text":"tok' in piece
    ]
    assert len(deltas) == 50
    assert [b"tok%d " % n in delta for n, delta in enumerate(deltas)] == [True] * 50
    if dialect is Dialect.GEMINI:  # the counts change on every chunk; the last chunk finishes it
        assert [json.loads(delta[6:])["usageMetadata"]["candidatesTokenCount"] for delta in deltas] == list(range(1, 51))
        assert b'"finishReason":"STOP"' in pieces[-1] and len(pieces) == 51


def _note_full_path(dialect: Dialect, monkeypatch) -> list[bytes]:
    """The pieces the full path reads from here on (the dialect's real framer, noting them)."""
    framed: list[bytes] = []

    class _NotingFramer(DIALECT_FRAMERS.get(dialect, EventFramer)):  # type: ignore[misc]
        def receive_data(self, data):
            framed.append(data)
            return super().receive_data(data)

    monkeypatch.setattr("finishline._repair.EventFramer", _NotingFramer)
    monkeypatch.setitem(DIALECT_FRAMERS, dialect, _NotingFramer)
    return framed


@pytest.mark.parametrize("dialect", list(BENCH_DIALECTS))
def test_the_core_passes_each_stream_untouched_and_reads_its_deltas_on_the_fast_path(dialect, monkeypatch) -> None:
    framed = _note_full_path(dialect, monkeypatch)
    pieces = dialect_stream(dialect, 200)
    repair = StreamRepair(request=request_facts(dialect), started_at=0.0, dialect=dialect)
    out = b"".join(repair.receive_data(piece, now=1.0) for piece in pieces) + repair.receive_end(now=2.0)
    assert out == b"".join(pieces)
    assert repair.report.verdict == "clean"
    # The routine deltas after the first (which taught the shape) never reach the full path: what
    # the bench's core figure measures is the fast path on routine text deltas.
    assert len(framed) <= len(pieces) - 199


@pytest.mark.parametrize("per_piece", [2, 3, 16])
@pytest.mark.parametrize("dialect", list(BENCH_DIALECTS))
def test_several_events_in_one_piece_take_the_fast_path_each(dialect, per_piece, monkeypatch) -> None:
    # A server that writes a few events at once: each routine delta is still read on the fast path
    # (the full path costs about twenty times as much), with the same bytes and books.
    events = dialect_stream(dialect, 200)
    alone = StreamRepair(request=request_facts(dialect), started_at=0.0, dialect=dialect)
    for event in events:
        alone.receive_data(event, now=1.0)
    alone.receive_end(now=2.0)
    framed = _note_full_path(dialect, monkeypatch)
    pieces = [b"".join(events[start : start + per_piece]) for start in range(0, len(events), per_piece)]
    repair = StreamRepair(request=request_facts(dialect), started_at=0.0, dialect=dialect)
    out = b"".join(repair.receive_data(piece, now=1.0) for piece in pieces) + repair.receive_end(now=2.0)
    assert out == b"".join(events)
    assert repair.report.as_json() == alone.report.as_json() and repair.report.verdict == "clean"
    assert len(framed) <= len(events) - 199
    # The full path read the first piece (whose line ending the framer learns), then single events only.
    assert framed[0] == pieces[0] and all(piece in events for piece in framed[1:])


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.GEMINI])
def test_a_body_that_is_not_the_upstreams_stops_the_bench(dialect):
    pieces = dialect_stream(dialect, 20)
    altered = [piece.replace(b"tok7 ", b"tok8 ") for piece in pieces]  # same size, other bytes
    with UpstreamServer() as upstream:
        path = upstream.route(Script(pieces=pieces)) + API[dialect][0]
        run = read_stream(upstream.port, Route(path, dialect, UpstreamBody.of(pieces)))
        assert run.events == len(pieces) and run.body_bytes == sum(map(len, pieces))
        for claimed, said in ((altered, "same size, other bytes"), (pieces[:-1], f"upstream: {len(pieces) - 1} events")):
            with pytest.raises(
                RuntimeError, match=f"the body from port {upstream.port}{re.escape(path)} is not the upstream's.*{said}"
            ):
                read_stream(upstream.port, Route(path, dialect, UpstreamBody.of(claimed)))


def test_a_bug_on_one_of_several_events_passes_it_and_the_rest_as_they_came(monkeypatch) -> None:
    events = dialect_stream(Dialect.CHAT, 20)
    repair = StreamRepair(request=request_facts(Dialect.CHAT), started_at=0.0)
    sent = b"".join(repair.receive_data(event, now=1.0) for event in events[:10])

    def bug(self, data, now):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(StreamRepair, "_on_routine_piece", bug)
    # A routine delta (the steady path's), then the finish chunk (which meets the bug), then [DONE].
    sent += repair.receive_data(events[10] + events[-2] + events[-1], now=1.0)
    sent += repair.receive_end(now=2.0)
    assert sent == b"".join(events[:11] + events[-2:])
    assert repair.report.internal_error and "a bug of ours" in repair.report.detail
    # The part that met the bug is booked as received and as sent, as every other byte.
    assert (repair.report.upstream_bytes, repair.report.client_bytes) == (len(sent), len(sent))


@pytest.mark.parametrize("per_piece", [1, 3])
def test_a_bug_on_the_steady_path_books_every_byte_it_passes(monkeypatch, per_piece) -> None:
    # The steady path counts a piece after its checks: a bug in them raises before the count, so
    # the caller's `give_up` books the piece from the count before the call.
    events = dialect_stream(Dialect.RESPONSES, 12)
    repair = StreamRepair(dialect=Dialect.RESPONSES, request=request_facts(Dialect.RESPONSES), started_at=0.0)
    calls = 0

    def bug_on_the_eighth(data, start, end):
        nonlocal calls
        calls += 1
        if calls == 8:
            raise RuntimeError("a bug of ours")
        return match_plain_text(data, start, end)

    monkeypatch.setattr(finishline_repair, "match_plain_text", bug_on_the_eighth)
    sent = b""
    for start in range(0, len(events), per_piece):
        piece = b"".join(events[start : start + per_piece])
        upstream_bytes = repair.report.upstream_bytes
        try:
            sent += repair.receive_data(piece, now=1.0)
        except RuntimeError as error:  # one event a piece: the bug reaches the caller (the addon)
            sent += repair.give_up(error, piece, upstream_bytes)
    sent += repair.receive_end(now=2.0)
    assert calls == 8, "the bug was met, and nothing was read after it"
    assert sent == b"".join(events)
    assert repair.report.internal_error and "a bug of ours" in repair.report.detail
    assert (repair.report.upstream_bytes, repair.report.client_bytes) == (len(sent), len(sent))
