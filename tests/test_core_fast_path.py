"""The fast path for routine text chunks (`finishline._routine_chunks`) against the full parse.

Contract: for any upstream bytes, cut into any pieces, with any ending (clean, failure, stall, the
client gone, left open), a `StreamRepair` with the fast path sends the client byte for byte what one
without it sends, after every piece, and ends with the same report. The fast path may only decline
(then the full path runs); it may never decide differently.

The streams are generated two ways: realistic ones (a role chunk, text deltas, reasoning, tool calls,
n > 1, usage, obfuscation padding, finishes, empty reasons, errors, [DONE], comments, CRLF/CR line
endings, pieces of one event each so the fast path gets its chance, and pieces split or merged
anywhere), and adversarial ones where the bytes of a learned shape's text gap are replaced by
arbitrary bytes (unescaped quotes, bad escapes, control characters, invalid UTF-8, `"finish_reason"`,
`\\r`, a second event).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finishline import Dialect, OnCut, RepairPolicy, RequestFacts, ShapeBook, StreamRepair
from finishline._routine_chunks import RoutineChunks
from finishline._sse import EventFramer
from finishline._wording import content_after_injection
from labs.worker.wire import malformed_event
from tests.bench import healthy_stream
from tests.feeding import CHUNKINGS, chunk, split

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that looks like the JSON around it, so a gap found by bytes alone would be found wrongly.
_TRICKY_TEXTS = st.sampled_from(
    [
        "",
        "Hello",
        " world",
        '"',
        "\\",
        '"finish_reason": ""',
        '", "finish_reason": "stop"}]}',
        '"content": "x"',
        "\r",
        "\n",
        "\r\n\r\n",
        "data: [DONE]\n\n",
        "é",
        "\u2028",
        "😀",
        "\x00",
        "\x7f",
        '{"error": {"message": "boom"}}',
        "\\u0000",
        "null",
    ]
)
_TEXTS = st.one_of(_TRICKY_TEXTS, st.text(max_size=12))
# Plain ASCII text, which the steady path takes (`match_plain_text`).
_PLAIN_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)


@st.composite
def _style(draw) -> dict:
    """How one server writes its chunks; fixed for a stream, as it is for a real server."""
    return {
        "separators": draw(st.sampled_from([(",", ":"), None])),
        "ensure_ascii": draw(st.booleans()),
        "reason_key": draw(st.booleans()),  # some servers leave finish_reason out until the end
        "obfuscation": draw(st.booleans()),
        "usage_null": draw(st.booleans()),
        "null_reasoning": draw(st.booleans()),
    }


@st.composite
def _delta(draw, style: dict):
    kind = draw(st.sampled_from(["content"] * 12 + ["role", "reasoning", "tool", "function", "empty", "mixed"]))
    text = draw(_TEXTS)
    if kind == "content":
        delta = {"content": text}
        if style["null_reasoning"]:
            delta["reasoning_content"] = None  # SGLang and others send the other keys as null
        return delta
    if kind == "role":
        return {"role": "assistant", "content": draw(st.sampled_from(["", text]))}
    if kind == "reasoning":
        return {draw(st.sampled_from(["reasoning_content", "reasoning", "refusal"])): text}
    if kind == "tool":
        return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
    if kind == "function":
        return {"function_call": {"arguments": text}}
    if kind == "empty":
        return {}
    return {"content": text, "tool_calls": draw(st.sampled_from([[], None, [{"index": 0}]]))}


@st.composite
def _chunk_data(draw, style: dict) -> bytes:
    """The data of one event: mostly routine text chunks, sometimes anything else a stream carries."""
    kind = draw(
        st.sampled_from(["text"] * 40 + ["finish", "empty_reason", "usage", "error", "done", "n2", "not_json", "array", "odd"])
    )
    if kind == "done":
        return b"[DONE]"
    if kind == "not_json":
        return draw(st.sampled_from([b"{", b"hello", b'{"choices": [', b"\xff\xfe"]))
    if kind == "array":
        return b"[1, 2]"
    body: dict[str, Any]
    if kind == "error":
        body = {"error": {"message": draw(_TEXTS), "code": "boom"}}
    elif kind == "usage":
        body = chunk(choices=[], usage={"completion_tokens": draw(st.integers(0, 20))})
    elif kind == "n2":
        body = chunk(choices=[{"index": index, "delta": draw(_delta(style)), "finish_reason": None} for index in range(2)])
    else:
        reason = {
            "text": None,
            "odd": None,
            "finish": draw(st.sampled_from(["stop", "length", "tool_calls"])),
            "empty_reason": "",
        }[kind]
        body = chunk(index=draw(st.sampled_from([0] * 5 + [1])), delta=draw(_delta(style)), finish_reason=reason)
        if not style["reason_key"] and reason is None:
            del body["choices"][0]["finish_reason"]
        if style["obfuscation"]:
            body["obfuscation"] = draw(st.text(max_size=6))
        if style["usage_null"]:
            body["usage"] = None
        if kind == "odd":  # one chunk that differs from the rest where the repair reads it
            body[draw(st.sampled_from(["id", "model", "system_fingerprint", "created"]))] = draw(
                st.sampled_from(["chatcmpl-2", "m\u00e9", 7, None])
            )
    return json.dumps(body, separators=style["separators"], ensure_ascii=style["ensure_ascii"]).encode()


@st.composite
def _event(draw, ending: bytes, style: dict) -> bytes:
    kind = draw(st.sampled_from(["data"] * 20 + ["comment", "event_error", "no_space", "two_lines", "blank", "malformed"]))
    if kind == "comment":
        return b": keep-alive" + ending + ending
    if kind == "malformed":  # rule C8: booked malformed, by either path
        return malformed_event(Dialect.CHAT, ending)
    if kind == "blank":
        return ending
    data = draw(_chunk_data(style))
    if kind == "event_error":
        return b"event: error" + ending + b"data: " + data + ending + ending
    if kind == "no_space":
        return b"data:" + data + ending + ending
    if kind == "two_lines":
        return b"id: 7" + ending + b"data: " + data + ending + ending
    return b"data: " + data + ending + ending


@st.composite
def _pieces(draw) -> list[bytes]:
    """Events cut into pieces: mostly one event per piece (how servers send them), sometimes split
    or merged anywhere."""
    ending = draw(st.sampled_from([b"\n"] * 4 + [b"\r\n", b"\r"]))
    style = draw(_style())
    events = draw(st.lists(_event(ending, style), min_size=3, max_size=40))
    pieces: list[bytes] = []
    for event in events:
        how = draw(st.sampled_from(["whole"] * 8 + ["split", "merge"]))
        if how == "split" and len(event) > 1:
            at = draw(st.integers(1, len(event) - 1))
            pieces += [event[:at], event[at:]]
        elif how == "merge" and pieces:
            pieces[-1] += event
        else:
            pieces.append(event)
    if draw(st.booleans()) and pieces:  # sometimes an unfinished event at the end
        last = draw(st.sampled_from(pieces))
        pieces.append(last[: draw(st.integers(0, len(last)))])
    return [piece for piece in pieces if piece]


@st.composite
def _adversarial_pieces(draw) -> list[bytes]:
    """A stream whose routine chunks teach a shape, then pieces that match that shape everywhere but
    in the text gap, which holds arbitrary bytes."""
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    prefix = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":'
    suffix = b'},"finish_reason":null}]}' + ending + ending
    pieces = [prefix + b'"a"' + suffix, prefix + b'"b"' + suffix]
    gaps = st.one_of(
        st.binary(max_size=12).map(lambda raw: b'"' + raw + b'"'),
        st.binary(max_size=12),
        st.sampled_from(
            [
                b'""',
                b'"\\"',
                b'"\\x"',
                b'"\\u12"',
                b'"\\ud800"',
                b'"\xed\xa0\x80"',
                b'"\xc0\xaf"',
                b'"a","finish_reason":"stop"',
                b'"a"},"finish_reason":""}]}' + ending + ending + b"data: {",
                b'"\r"',
                b'"\t"',
                b"1",
                b"null",
                b'"x" ',
                b' "x"',
            ]
        ),
    )
    for gap in draw(st.lists(gaps, min_size=1, max_size=12)):
        pieces.append(prefix + gap + suffix)
    pieces.append(b"data: [DONE]" + ending + ending)
    return pieces


@st.composite
def _adversarial_padded_pieces(draw) -> list[bytes]:
    """A padded shape (text and `obfuscation`: two string gaps, the steady path's `SteadyShape`)
    taught and taken, then pieces that match it everywhere but in one of the gaps, which holds
    arbitrary bytes (the other a plain string)."""
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    prefix = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":'
    middle = b'},"finish_reason":null}],"obfuscation":'
    suffix = b"}" + ending + ending
    pieces = [prefix + b'"a"' + middle + b'"p"' + suffix for _ in range(3)]
    gaps = st.one_of(
        st.binary(max_size=12).map(lambda raw: b'"' + raw + b'"'),
        st.binary(max_size=12),
        st.sampled_from([b'""', b'"\\"', b'"a"' + middle + b'"b"', b'"a"}', b'"\r"', b"1", b"null", b'"x" ', b'"\\u00e9"']),
    )
    for gap in draw(st.lists(gaps, min_size=1, max_size=12)):
        plain = b'"' + draw(_PLAIN_TEXT).encode() + b'"'
        pieces.append(prefix + gap + middle + plain + suffix if draw(st.booleans()) else prefix + plain + middle + gap + suffix)
        pieces += [prefix + b'"x"' + middle + b'"yz"' + suffix] * draw(st.integers(0, 2))
    pieces.append(b"data: [DONE]" + ending + ending)
    return pieces


@st.composite
def _runs_of_one_shape(draw) -> list[bytes]:
    """Long runs of routine chunks of one shape (what the repair machine's steady path takes), each
    broken by any other event a stream carries, whole or split."""
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    style = {**draw(_style()), "obfuscation": False, "usage_null": False}
    # OpenAI's padding: another string gap, which the steady path takes too (`SteadyShape`).
    padded = draw(st.booleans())
    pieces: list[bytes] = []
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.sampled_from([0, 0, 0, 1]))
        for text in draw(st.lists(st.one_of(_PLAIN_TEXT, _TEXTS), min_size=1, max_size=25)):
            body = chunk(text, index=index)
            if not style["reason_key"]:
                del body["choices"][0]["finish_reason"]
            if padded:
                body["obfuscation"] = draw(st.one_of(_PLAIN_TEXT, _TEXTS))
            data = json.dumps(body, separators=style["separators"], ensure_ascii=style["ensure_ascii"]).encode()
            pieces.append(b"data: " + data + ending + ending)
        other = draw(_event(ending, style))
        if draw(st.booleans()) and len(other) > 1:
            at = draw(st.integers(1, len(other) - 1))
            pieces += [other[:at], other[at:]]
        else:
            pieces.append(other)
    return pieces


def _run_both(
    pieces: list[bytes],
    end: str,
    *,
    policy: RepairPolicy,
    request: RequestFacts,
    dialect: Dialect = Dialect.CHAT,
    shapes: ShapeBook | None = None,
) -> None:
    """The fast path (with `shapes`, the book of other streams' shapes, if given) against the full parse."""
    machines = [
        StreamRepair(
            request=request,
            policy=policy,
            started_at=0.0,
            fast_path=fast_path,
            dialect=dialect,
            shapes=shapes if fast_path else None,
        )
        for fast_path in (True, False)
    ]
    now = 0.0
    for piece in pieces:
        now += 0.5
        outputs = [machine.receive_data(piece, now=now) for machine in machines]
        assert outputs[0] == outputs[1], f"piece {piece!r}"
        checks = [machine.next_stall_check(now) for machine in machines]
        assert checks[0] == checks[1], f"next stall check after piece {piece!r}"
    now += 0.5
    endings: list[object]  # what each machine's end returned (bytes, a ClientEnding, None)
    if end == "clean":
        endings = [machine.receive_end(now=now) for machine in machines]
    elif end == "failure":
        endings = [machine.receive_failure("peer reset", now=now) for machine in machines]
    elif end == "stall":
        endings = [machine.receive_timer(now + 1000.0) for machine in machines]
    elif end == "client_gone":
        for machine in machines:  # it returns nothing: only the books below can differ
            machine.receive_client_gone("client disconnected", now=now)
        endings = [None, None]
    else:
        endings = [None, None]
    assert endings[0] == endings[1]
    assert machines[0].report.as_json() == machines[1].report.as_json()


_POLICIES = st.builds(
    RepairPolicy,
    empty_to_null=st.booleans(),
    on_cut=st.sampled_from(list(OnCut)),
    idle_timeout=st.sampled_from([0.0, 2.0]),
    first_token_timeout=st.sampled_from([0.0, 2.0]),
    limit_reasons=st.booleans(),
    responses_indexes=st.booleans(),
)
_REQUESTS = st.sampled_from(
    [RequestFacts(), RequestFacts(max_tokens=3, model="m1"), RequestFacts(max_tokens=3, model="m1", stream_usage=True)]
)
_ENDS = st.sampled_from(["clean", "failure", "stall", "client_gone", "open"])


@SETTINGS
@given(pieces=_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_realistic_streams(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request)


@SETTINGS
@given(pieces=_adversarial_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_when_the_text_gap_holds_any_bytes(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request)


@SETTINGS
@given(pieces=_runs_of_one_shape(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_long_runs_of_one_shape(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request)


@SETTINGS
@given(pieces=_adversarial_padded_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_when_a_padded_shape_s_gaps_hold_any_bytes(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request)


@SETTINGS
@given(pieces=_runs_of_one_shape(), chunking=st.sampled_from(CHUNKINGS), seed=st.integers(0, 1000), end=_ENDS)
def test_long_runs_of_one_shape_fed_whole_bytewise_and_at_random_splits(pieces, chunking, seed, end):
    _run_both(split(b"".join(pieces), chunking, seed), end, policy=RepairPolicy(), request=RequestFacts())


def test_text_after_an_injected_finish_is_noticed_on_the_steady_path():
    # A usage chunk mid-stream gets a finish injected before it; text that follows means the usage
    # chunk was not the end. An empty text chunk of the routine shape first leaves the steady path
    # closed, so the text after it is still noticed.
    def text(content: str) -> bytes:
        return b"data: " + json.dumps(chunk(content)).encode() + b"\n\n"

    usage = b"data: " + json.dumps(chunk(choices=[], usage={"completion_tokens": 2})).encode() + b"\n\n"
    pieces = [text("a"), text("b"), text("c"), usage, text(""), text("d"), text("e"), b"data: [DONE]\n\n"]
    for end in ("clean", "failure"):
        _run_both(pieces, end, policy=RepairPolicy(), request=RequestFacts())
    repair = StreamRepair()
    for piece in pieces:
        repair.receive_data(piece)
    repair.receive_end()
    assert content_after_injection() in repair.report.repairs


@SETTINGS
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8), end=_ENDS)
def test_fast_and_full_paths_agree_on_arbitrary_bytes(data, cuts, end):
    # Arbitrary bytes after a learned shape, so the fast path is tried on every piece.
    learned = list(healthy_stream(2)())[:2]
    bounds = sorted({0, len(data), *(cut for cut in cuts if cut <= len(data))})
    pieces = learned + [data[a:b] for a, b in zip(bounds, bounds[1:])]
    _run_both(pieces, end, policy=RepairPolicy(), request=RequestFacts())


# -- the fast path is taken, where it should be ----------------------------------------------------


class _CountingRoutineChunks(RoutineChunks):
    """The real class, counting the pieces it matched."""

    matched = 0

    def maybe_match(self, piece):
        result = super().maybe_match(piece)
        if result is not None:
            type(self).matched += 1
        return result


@pytest.fixture
def counted(monkeypatch):
    monkeypatch.setattr("finishline._repair.RoutineChunks", _CountingRoutineChunks)
    _CountingRoutineChunks.matched = 0
    return _CountingRoutineChunks


@pytest.fixture
def framed(monkeypatch) -> list[bytes]:
    """The pieces the full path reads from here on (the machines' framers are the real one,
    noting what they are given)."""
    pieces: list[bytes] = []

    class _CountingFramer(EventFramer):
        def receive_data(self, data):
            pieces.append(data)
            return super().receive_data(data)

    monkeypatch.setattr("finishline._repair.EventFramer", _CountingFramer)
    return pieces


def test_the_bench_stream_takes_the_fast_path_after_its_first_chunk(framed):
    pieces = list(healthy_stream(1000)())
    repair = StreamRepair(started_at=0.0)
    out = b"".join(repair.receive_data(piece, now=1.0) for piece in pieces) + repair.receive_end(now=2.0)
    assert out == b"".join(pieces)
    assert repair.report.verdict == "clean" and repair.report.events == 1002
    # The first text chunk taught the shape; the finish chunk and [DONE] are not routine.
    assert framed == [pieces[0], pieces[-2], pieces[-1]]


def test_openai_chunks_with_obfuscation_padding_take_the_fast_path(framed):
    def openai_chunk(text: str, padding: str) -> bytes:
        body = chunk(text, system_fingerprint="fp_1", service_tier="default", obfuscation=padding)
        body["choices"][0]["logprobs"] = None
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    role = chunk(delta={"role": "assistant", "content": "", "refusal": None})
    pieces = [b"data: " + json.dumps(role).encode() + b"\n\n"]
    padded = [("Hel", "ab"), ("lo", "x"), (" w", "y2Q"), ("!", ""), ("\u00e9", "Zz")] + [
        (f" t{n}", "p" * (n % 9)) for n in range(50)
    ]
    pieces += [openai_chunk(text, padding) for text, padding in padded]
    repair = StreamRepair()
    for piece in pieces:
        assert repair.receive_data(piece) == piece
    # The role chunk and the first padded chunk (it teaches the shape) are read in full; every
    # other one is matched, by the fast path or its steady path, whatever its padding.
    assert framed == pieces[:2]
    assert repair.report.events == len(pieces)


def test_a_stream_whose_id_changes_on_every_chunk_stops_learning(counted):
    pieces = [b"data: " + json.dumps(chunk(f"t{n}", id=f"chatcmpl-{n}")).encode() + b"\n\n" for n in range(200)]
    repair = StreamRepair()
    for piece in pieces:
        repair.receive_data(piece)
    assert counted.matched == 0
    # Each attempt costs a few parses: after the first 8, at most one per 16 events.
    assert repair._routine._attempts <= 8 + (200 - 8 * 16) // 16 + 1


def test_a_finish_reason_or_a_tool_call_is_never_routine():
    routine = RoutineChunks()
    for body in [
        chunk("a", finish_reason="stop"),
        chunk("a", finish_reason=""),
        chunk(delta={"content": "a", "tool_calls": [{"index": 0}]}),
        chunk(choices=[{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]),
        chunk("a", usage={"completion_tokens": 1}),
        {"error": None, **chunk("a"), "choices": "x"},
    ]:
        data = json.dumps(body).encode()
        routine.learn(b"data: " + data + b"\n\n", data, body, 0)
    assert not routine.learned


def test_a_learned_shape_matches_any_json_string_text_and_says_whether_it_is_empty():
    routine = RoutineChunks()
    body = chunk("Hello")
    data = json.dumps(body).encode()
    routine.learn(b"data: " + data + b"\n\n", data, body, 0)
    for text, has_text in [("", False), ("x", True), ('"finish_reason": ""', True), ("é😀", True)]:
        for ascii_only in (True, False):
            other = json.dumps(chunk(text), ensure_ascii=ascii_only).encode()
            match = routine.maybe_match(b"data: " + other + b"\n\n")
            assert match is not None and match.index == 0 and match.has_text is has_text
    assert routine.maybe_match(b"data: " + data + b"\r\n\r\n") is None
    assert routine.maybe_match(b"data: " + json.dumps(chunk("a", model="m2")).encode() + b"\n\n") is None
