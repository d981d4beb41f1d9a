"""Fuzz contracts of the repair core in the Gemini dialect (hypothesis): any bytes, any split points,
any way to end (clean, failure, stall), both stream forms.

Contracts:

1. It never raises on what the upstream sent, and never reports an internal error (any bytes: SSE
   frames, array pieces, Code Assist frames and noise mixed).
2. SSE form: the client's events are the upstream's complete events, unchanged, in order (but for a
   G7 rewrite of `STOP` to `MAX_TOKENS`, which the report counts, and a last whole chunk without its
   blank line, whose framing is completed), and the only other event is the one error frame of a
   cut; an incomplete event left at the end is dropped, never changed.
3. SSE form: unless nothing was to be added (on_cut=pass, a stream passed through), a stream that
   did not finish ends in exactly one error frame (the upstream's or finish_fix's), and nothing is
   left half-framed after finish_fix's.
4. Array form, cut anywhere: unless nothing was to be added, the client's body is one valid JSON
   array: the upstream's whole elements as they came, in order, then, if the stream did not finish,
   one error element; never a finishReason the upstream did not send.
"""

from __future__ import annotations

import copy
import json

from hypothesis import given
from hypothesis import strategies as st

from finishline import Dialect, EventFramer, OnCut, RepairPolicy, RequestFacts, StreamRepair, Verdict
from tests.gemini_streams import array_body, array_elements, code_assist, gemini_chunk, gemini_error, sse_body
from tests.test_core_fuzz import SETTINGS, splits
from tests.test_core_fuzz import run as fuzz_run

GEMINI = Dialect.GEMINI
ON_CUTS = st.sampled_from(list(OnCut))
ENDINGS = [b"\n", b"\r\n"]
# Chunks that mean something to the rules (the fuzz's request allows 3 output tokens: G7 at 3).
_CHUNKS = [
    gemini_chunk("a", tokens=1),
    gemini_chunk("b", tokens=2, index=1),
    gemini_chunk("c", finish="STOP", tokens=2),
    gemini_chunk("d", finish="STOP", tokens=3),
    gemini_chunk("", finish="MAX_TOKENS", tokens=3),
    gemini_chunk("e", finish="", tokens=2),
    gemini_chunk("f", finish="FINISH_REASON_UNSPECIFIED", tokens=2),
    gemini_chunk(None, function_call={"name": "f", "args": {"x": "{]"}}, finish="STOP", tokens=1),
    {"promptFeedback": {"blockReason": "SAFETY"}},
    {"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL", "index": 0}]},
    code_assist(gemini_chunk("g", tokens=1)),
    code_assist(gemini_chunk("h", finish="STOP", tokens=1)),
    gemini_error(),
]
CHUNKS = st.lists(st.sampled_from(_CHUNKS), max_size=6)
_NOISE = [b": keep-alive\n\n", b"\n", b"\r", b"data: ", b"data:{", b"[", b"]", b",", b"{", b'"', b"\\", b"\xef\xbb\xbf"]
_PIECES = [sse_body([chunk], ending=ending) for chunk in _CHUNKS for ending in ENDINGS] + [
    array_body([chunk])[1:-1] for chunk in _CHUNKS
]
ANY_BYTES = st.lists(st.one_of(st.binary(max_size=30), st.sampled_from(_PIECES + _NOISE)), max_size=12).map(b"".join)


@given(st.data())
@SETTINGS
def test_contract_1_never_raises_on_any_bytes(data):
    _, repair, _, _ = fuzz_run(data, on_cut=data.draw(ON_CUTS), dialect=GEMINI, upstream=ANY_BYTES)
    assert repair.report.internal_error is None


def _sse_events(body: bytes):
    framer = EventFramer()
    return framer.receive_data(body), framer.receive_end()


def _is_ours(event) -> bool:
    return event.data is not None and event.data.startswith(b'{"error"') and b"(finish_fix)" in event.data


def _undo_g7(event_data: bytes | None) -> object:
    """The chunk with a `MAX_TOKENS` put back to `STOP` (what G7 changed), parsed."""
    chunk = json.loads(event_data) if event_data else None
    undone = copy.deepcopy(chunk)
    body = undone.get("response", undone) if isinstance(undone, dict) else None
    for candidate in body.get("candidates", []) if isinstance(body, dict) else []:
        if candidate.get("finishReason") == "MAX_TOKENS":
            candidate["finishReason"] = "STOP"
    return undone


@given(st.data())
@SETTINGS
def test_contracts_2_and_3_sse_events_pass_unchanged_and_a_cut_ends_in_one_error(data):
    chunks = data.draw(CHUNKS)
    ending = data.draw(st.sampled_from(ENDINGS))
    whole = sse_body(chunks, ending=ending)
    cut_at = data.draw(st.integers(min_value=0, max_value=len(whole)))
    on_cut = data.draw(ON_CUTS)
    upstream, repair, out, _ = fuzz_run(data, on_cut=on_cut, dialect=GEMINI, upstream=st.just(whole[:cut_at]))
    report = repair.report
    assert report.internal_error is None
    expected, leftover = _sse_events(upstream)
    got, client_leftover = _sse_events(out)
    if "completed the framing of the last event" in report.repairs:
        # A whole JSON chunk that lacked only its blank line at a clean end was read (as in Chat).
        assert leftover is not None and any(event.raw.startswith(leftover.raw) for event in got)
        expected, leftover = [*expected, next(event for event in got if event.raw.startswith(leftover.raw))], None
    ours = [event for event in got if _is_ours(event)]
    theirs = [event for event in got if not _is_ours(event)]
    assert [event.raw for event in theirs] == [event.raw for event in expected] or (
        report.corrections and [_undo_g7(event.data) for event in theirs] == [_undo_g7(event.data) for event in expected]
    )
    assert len(ours) == len(report.injected) <= 1
    if report.verdict is Verdict.SKIPPED or on_cut is OnCut.PASS:
        return
    if ours:
        assert got[-1] is ours[-1] and client_leftover is None  # the error frame last, nothing half-framed
        assert report.verdict in (Verdict.INTERRUPTED, Verdict.MALFORMED)
    elif report.verdict is Verdict.UPSTREAM_ERROR:
        assert any(json.loads(event.data).get("error") for event in theirs if event.data)
    else:
        # A finished stream: a half frame after it is dropped, never sent half.
        assert report.verdict in (Verdict.CLEAN, Verdict.REPAIRED) and client_leftover is None
        assert report.dropped_incomplete_bytes == (len(leftover.raw) if leftover is not None else 0)


@given(st.data())
@SETTINGS
def test_contract_4_a_cut_array_stays_one_json_array(data):
    chunks = data.draw(CHUNKS)
    whole = array_body(chunks)
    cut_at = data.draw(st.integers(min_value=0, max_value=len(whole)))
    on_cut = data.draw(st.sampled_from([OnCut.ERROR, OnCut.STOP]))
    upstream = whole[:cut_at]
    # The adapter reads the form from the path (no `alt=sse`): what a body with no byte gets.
    request = RequestFacts(json_array_stream=True)
    repair = StreamRepair(dialect=GEMINI, request=request, policy=RepairPolicy(on_cut=on_cut))
    out = b"".join(repair.receive_data(piece) for piece in data.draw(splits(upstream)))
    end = data.draw(st.sampled_from(["clean", "failure"]))
    out += repair.receive_end() if end == "clean" else repair.receive_failure("reset").client_bytes
    report = repair.report
    assert report.internal_error is None
    if report.verdict is Verdict.UPSTREAM_ERROR:
        assert out == upstream  # G4: nothing after the upstream's error, even an unclosed array
        return
    elements = json.loads(out)
    assert isinstance(elements, list)
    arrived, position = [], 0
    for chunk, piece in zip(chunks, array_elements(chunks), strict=False):
        position += len(piece)
        if position <= cut_at:
            arrived.append(chunk)
    upstream_part, added = elements[: len(arrived)], elements[len(arrived) :]
    assert upstream_part == arrived
    if report.verdict is Verdict.INTERRUPTED:
        assert len(added) == 1 and list(added[0]) == ["error"] and added[0]["error"]["code"] == 503
    else:
        assert report.verdict in (Verdict.CLEAN, Verdict.REPAIRED) and added == []
        assert any(
            candidate.get("finishReason") not in (None, "", "FINISH_REASON_UNSPECIFIED")
            for chunk in arrived
            for candidate in chunk.get("response", chunk).get("candidates", [])
        ) or any("promptFeedback" in chunk for chunk in arrived)
