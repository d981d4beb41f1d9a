"""The fast path in the Gemini dialect is held to the full parse: for generated streams in both stream
forms (SSE and the JSON array; AI Studio's chunks, Code Assist's wrapping, translating gateways'
`"finishReason": null`), runs of routine text chunks whose `usageMetadata` counts change by any
amount, broken by every other kind of chunk (finish reasons, empty and unspecified ones,
`finishReason` inside the text, several candidates, function calls, thoughts, usage that changes
shape, errors, blocked prompts, garbage), split or merged anywhere, fed one chunk per piece, whole,
byte by byte and at random splits, both paths give the same bytes, the same stall checks and the
same report, whatever the end (`tests.test_core_fast_path._run_both`). Adversarial pieces put any
bytes in a learned shape's text or count gaps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from finishline import Dialect, RepairPolicy, RequestFacts, StreamRepair
from finishline._routine_chunks import RoutineChunks
from finishline._rules import DIALECT_FRAMERS
from finishline._steady import counted_steady
from tests.feeding import CHUNKINGS, split
from tests.gemini_streams import MODEL, array_elements, code_assist, gemini_chunk, gemini_chunks, gemini_error
from tests.test_core_fast_path import _ENDS, _POLICIES, _TEXTS, SETTINGS, _run_both
from tests.test_core_fast_path_dialects import _maybe_split
from tests.test_core_shape_book import _run_streams

GEMINI = Dialect.GEMINI
_PLAIN_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=8)
# Text that looks like the chunk around it, so a gap found by bytes alone would be found wrongly.
_GEMINI_TEXTS = st.sampled_from(
    [
        '"finishReason": "STOP"',
        '"}], "role": "model"}, "finishReason": "STOP", "index": 0}]',
        '","finishReason":"STOP"',
        '"candidatesTokenCount": 5',
        ', "totalTokenCount": 9}',
        '{"error": {"code": 503}}',
        "Line one\nline two\ttab \\ back",
        "\u00e9t\u00e9 \U0001f600",
    ]
)
_ANY_TEXT = st.one_of(_PLAIN_TEXT, _PLAIN_TEXT, _TEXTS, _GEMINI_TEXTS)
# Requests whose `maxOutputTokens` the counts may reach (rule G7), and the array form's (a cut before
# any chunk is answered in the request's form).
_REQUESTS = st.sampled_from(
    [
        RequestFacts(),
        RequestFacts(max_tokens=12, model="gemini-2.5-flash"),
        RequestFacts(max_tokens=40),
        RequestFacts(json_array_stream=True, max_tokens=12),
    ]
)


@st.composite
def _style(draw) -> dict[str, Any]:
    """How one server writes its chunks; fixed for a stream, as it is for a real server."""
    return {
        "separators": draw(st.sampled_from([None, (",", ":")])),
        "ensure_ascii": draw(st.booleans()),
        "usage": draw(st.sampled_from(["counts"] * 6 + ["thoughts", "details", "none", "null"])),
        "usage_first": draw(st.integers(0, 4)) == 0,  # `usageMetadata` before `candidates`
        "null_reason": draw(st.integers(0, 4)) == 0,  # LiteLLM's `"finishReason": null` on open chunks
        "wrapped": draw(st.integers(0, 5)) == 0,  # Code Assist: {"response": {…}, "traceId": …}
        "prompt": draw(st.sampled_from([4, 9, 10, 99, 1234])),
    }


class _Counts:
    """The stream's cumulative counts: output tokens grow by any amount, across digit carries."""

    def __init__(self, draw, style: dict[str, Any]) -> None:
        self.draw, self.style = draw, style
        self.output = draw(st.sampled_from([0, 1, 7, 8, 9, 95, 99, 998]))
        self.thoughts = 0

    def usage(self) -> dict[str, Any] | None:
        self.output += self.draw(st.sampled_from([1] * 6 + [0, 2, 3, 5, 11, 90, -1]))
        self.output = max(self.output, 0)
        kind, prompt = self.style["usage"], self.style["prompt"]
        if kind == "none":
            return None
        usage: dict[str, Any] = {"promptTokenCount": prompt, "candidatesTokenCount": self.output}
        usage["totalTokenCount"] = prompt + self.output + self.thoughts
        if kind == "thoughts":
            usage["thoughtsTokenCount"] = self.thoughts
        elif kind == "details":
            usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
        return usage


@st.composite
def _chunks(draw, *, array: bool = False) -> list[dict[str, Any] | bytes]:
    """A stream's chunks (dicts; bytes for what is not one: garbage, a comment), mostly routine."""
    style = draw(_style())
    counts = _Counts(draw, style)

    def chunk(parts: list[dict[str, Any]] | None, *, reason: Any = None, index: int = 0, **extra: Any) -> dict[str, Any]:
        candidate: dict[str, Any] = {}
        if parts is not None:
            candidate["content"] = {"parts": parts, "role": "model"}
        if reason is not None or style["null_reason"]:
            candidate["finishReason"] = reason
        candidate["index"] = index
        usage = counts.usage()
        body: dict[str, Any] = {"candidates": [candidate]}
        if style["usage"] == "null":
            body["usageMetadata"] = None
        elif usage is not None:
            body["usageMetadata"] = usage
        if style["usage_first"] and "usageMetadata" in body:
            body = {"usageMetadata": body["usageMetadata"], "candidates": body["candidates"]}
        body |= {"modelVersion": MODEL, "responseId": "IZI2acSKMoWl0-kPmYj2yQc", **extra}
        return code_assist(body) if style["wrapped"] else body

    out: list[dict[str, Any] | bytes] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(
            st.sampled_from(
                ["text"] * 30
                + ["thought"] * 3
                + ["empty", "finish", "call", "two_parts", "n2", "index1"]
                + ["odd_usage", "odd_model", "usage_only", "error", "feedback", "garbage"]
            )
        )
        if kind == "text":
            out.append(chunk([{"text": draw(_ANY_TEXT)}]))
        elif kind == "thought":
            counts.thoughts += draw(st.integers(0, 4))
            out.append(chunk([{"text": draw(_ANY_TEXT), "thought": True}]))
        elif kind == "empty":
            out.append(chunk([{"text": ""}]))
        elif kind == "finish":
            reason = draw(st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY", "", "FINISH_REASON_UNSPECIFIED"]))
            out.append(chunk([{"text": draw(_ANY_TEXT)}], reason=reason))
        elif kind == "call":  # a call is a token (G5), with or without text beside it
            call = {"functionCall": {"name": "get_weather", "args": {"city": draw(_PLAIN_TEXT)}}}
            out.append(chunk([draw(st.sampled_from([call, {"text": "", **call}]))]))
        elif kind == "two_parts":
            out.append(chunk([{"text": draw(_ANY_TEXT)}, {"text": draw(_ANY_TEXT)}]))
        elif kind == "n2":
            two = chunk([{"text": draw(_ANY_TEXT)}])
            body = two.get("response", two)
            body["candidates"].append({**body["candidates"][0], "index": 1})
            out.append(two)
        elif kind == "index1":
            out.append(chunk([{"text": draw(_ANY_TEXT)}], index=1))
        elif kind == "odd_usage":  # values no rule reads as a count, and a negative one
            odd = chunk([{"text": draw(_PLAIN_TEXT)}])
            body = odd.get("response", odd)
            body["usageMetadata"] = {"promptTokenCount": draw(st.sampled_from([5.0, "7", True, -1, None]))}
            out.append(odd)
        elif kind == "odd_model":
            out.append(chunk([{"text": draw(_PLAIN_TEXT)}], modelVersion="gemini-other"))
        elif kind == "usage_only":
            out.append({"usageMetadata": counts.usage() or {}, "modelVersion": MODEL})
        elif kind == "error":
            out.append(gemini_error())
        elif kind == "feedback":
            out.append({"promptFeedback": {"blockReason": "SAFETY"}})
        elif not array:  # garbage: rule C8 (malformed), and a comment
            out.append(draw(st.sampled_from([b"data: {\n\n", b"data: hello\n\n", b": keep-alive\n\n", b"\n"])))
    tail = draw(st.sampled_from(["stop", "stop_no_usage", "cut", "cut", "error"]))
    if tail == "stop":
        out.append(chunk([{"text": draw(_PLAIN_TEXT)}], reason="STOP"))
    elif tail == "stop_no_usage":  # rule G7 then reads the counts of the last routine chunk
        last = chunk([{"text": ""}], reason="STOP")
        last.get("response", last).pop("usageMetadata", None)
        out.append(last)
    elif tail == "error":
        out.append(gemini_error())
    return out


def _dumps(chunk: dict[str, Any], style: dict[str, Any]) -> bytes:
    return json.dumps(chunk, separators=style["separators"], ensure_ascii=style["ensure_ascii"]).encode()


@st.composite
def _sse_pieces(draw) -> list[bytes]:
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    style = {"separators": draw(st.sampled_from([None, (",", ":")])), "ensure_ascii": draw(st.booleans())}
    pieces = []
    for chunk in draw(_chunks()):
        if isinstance(chunk, bytes):
            pieces.append(chunk.replace(b"\n", ending))
        else:
            pieces.append(b"data: " + _dumps(chunk, style) + ending + ending)
    return _maybe_split(draw, pieces)


@st.composite
def _array_pieces(draw) -> list[bytes]:
    pretty = draw(st.booleans())  # Google pretty-prints the elements
    separator = draw(st.sampled_from([b",\r\n", b","]))
    chunks = [chunk for chunk in draw(_chunks(array=True)) if isinstance(chunk, dict)]
    if pretty and separator == b",\r\n":
        pieces = array_elements(chunks, closed=draw(st.booleans()))
    else:
        pieces = [(b"[" if number == 0 else separator) + json.dumps(chunk).encode() for number, chunk in enumerate(chunks)]
        if draw(st.booleans()):
            pieces.append(b"]")
    # Whitespace between elements, sent as a piece of its own (valid JSON, held by the framer).
    for _ in range(draw(st.integers(0, 2))):
        pieces.insert(draw(st.integers(1, max(1, len(pieces)))), draw(st.sampled_from([b"\r\n", b" ", b"\n\n"])))
    return _maybe_split(draw, pieces)


@SETTINGS
@given(pieces=_sse_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_gemini_sse_streams(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=GEMINI)


@SETTINGS
@given(pieces=_array_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_gemini_array_streams(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=GEMINI)


@SETTINGS
@given(form=st.sampled_from(["sse", "array"]), data=st.data(), chunking=st.sampled_from(CHUNKINGS), seed=st.integers(0, 1000))
def test_gemini_streams_fed_whole_bytewise_and_at_random_splits(form, data, chunking, seed):
    pieces = data.draw(_sse_pieces() if form == "sse" else _array_pieces())
    end = data.draw(_ENDS)
    _run_both(
        split(b"".join(pieces), chunking, seed), end, policy=RepairPolicy(), request=RequestFacts(max_tokens=12), dialect=GEMINI
    )


@st.composite
def _gemini_streams(draw) -> list[list[bytes]]:
    """Streams of one server (the first one's chunks again, its `responseId` changed) or another."""
    first = draw(st.one_of(_sse_pieces(), _array_pieces()))
    streams = []
    for number in range(draw(st.integers(2, 4))):
        pieces = first if number == 0 or draw(st.integers(0, 3)) else draw(st.one_of(_sse_pieces(), _array_pieces()))
        streams.append([piece.replace(b"IZI2acSKMoWl0-kPmYj2yQc", b"r%d" % number) for piece in pieces])
    return streams


@SETTINGS
@given(streams=_gemini_streams(), ends=st.lists(_ENDS, min_size=4, max_size=4), policy=_POLICIES, request=_REQUESTS)
def test_gemini_streams_sharing_a_shape_book_agree_with_the_full_parse(streams, ends, policy, request):
    # (A shape with counts is kept out of the book; one without usage may be kept.)
    _run_streams(streams, ends, policy=policy, request=request, dialect=GEMINI)


# -- adversarial: any bytes in a learned shape's gaps ---------------------------------------------------

_HEAD = b'data: {"candidates": [{"content": {"parts": [{"text": '
_MIDDLE = b'}], "role": "model"}, "index": 0}], "usageMetadata": {"promptTokenCount": '
_TOTAL = b', "candidatesTokenCount": '
_TAIL_KEY = b', "totalTokenCount": '
_TAIL = b'}, "modelVersion": "gemini-2.5-flash", "responseId": "IZI2acSKMoWl0-kPmYj2yQc"}'
_NUMBER_BYTES = st.one_of(
    st.sampled_from(
        [b"0", b"00", b"007", b"-1", b"1e3", b"1.0", b" 5", b"5 ", b"99999999999999999999", b'"5"', b"null", b"true", b"", b"1,2"]
    ),
    st.binary(max_size=6),
)
_TEXT_BYTES = st.one_of(
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
            b'"\r"',
            b'"a"}], "role": "model"}, "finishReason": "STOP", "index": 0}], "x": {"y": 1',
            b'"a", "functionCall": {"name": "f"}',
            b'"a"}, {"text": "b"',
        ]
    ),
)


def _piece(text: bytes, prompt: bytes, output: bytes, total: bytes, ending: bytes) -> bytes:
    return _HEAD + text + _MIDDLE + prompt + _TOTAL + output + _TAIL_KEY + total + _TAIL + ending + ending


@st.composite
def _adversarial_pieces(draw) -> list[bytes]:
    """Routine chunks teach a shape and run on its steady path; then pieces that are that shape but
    for one gap (the text or a count), which holds any bytes, each followed by routine ones."""
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    output = 1

    def routine() -> bytes:
        nonlocal output
        output += draw(st.integers(0, 12))
        return _piece(b'"%s"' % draw(_PLAIN_TEXT).encode(), b"4", b"%d" % output, b"%d" % (output + 4), ending)

    pieces = [routine() for _ in range(3)]
    for _ in range(draw(st.integers(1, 10))):
        gap = draw(st.sampled_from(["text", "prompt", "output", "total"]))
        odd = draw(_TEXT_BYTES if gap == "text" else _NUMBER_BYTES)
        fields = {"text": b'"x"', "prompt": b"4", "output": b"%d" % output, "total": b"%d" % (output + 4), gap: odd}
        pieces.append(_piece(fields["text"], fields["prompt"], fields["output"], fields["total"], ending))
        pieces += [routine() for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        pieces.append(b"data: " + json.dumps(gemini_chunks(["."])[0] | {"responseId": "IZI2acSKMoWl0-kPmYj2yQc"}).encode()[:-1])
    return pieces


@SETTINGS
@given(pieces=_adversarial_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_when_a_gemini_shape_s_gaps_hold_any_bytes(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=GEMINI)


# -- the fast path is taken, where it should be ------------------------------------------------------


@pytest.fixture
def framed(monkeypatch) -> list[bytes]:
    """The pieces the full path reads from here on (the machines' Gemini framer is the real one,
    noting what it is given)."""
    pieces: list[bytes] = []

    class _CountingFramer(DIALECT_FRAMERS[GEMINI]):  # type: ignore[valid-type,misc]
        def receive_data(self, data):
            pieces.append(data)
            return super().receive_data(data)

    monkeypatch.setitem(DIALECT_FRAMERS, GEMINI, _CountingFramer)
    return pieces


def _ai_studio_chunks(count: int, *, finish: str | None = "STOP") -> list[dict[str, Any]]:
    """AI Studio's chunks: several tokens each (the counts grow by more than one), the last with
    `finish`."""
    chunks = gemini_chunks([f" w{number % 7}\\n" for number in range(count)], finish=finish)
    for number, chunk in enumerate(chunks):
        usage = chunk["usageMetadata"]
        usage["candidatesTokenCount"] = 3 * number + 2
        usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"]
    return chunks


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_gemini_sse_chunks_take_the_fast_path_after_the_first(framed, ending):
    pieces = [b"data: " + json.dumps(chunk).encode() + ending + ending for chunk in _ai_studio_chunks(300)]
    repair = StreamRepair(dialect=GEMINI)
    out = b"".join(repair.receive_data(piece) for piece in pieces) + repair.receive_end()
    assert out == b"".join(pieces) and repair.report.verdict == "clean"
    # The first chunk teaches the shape; the 298 after it are matched; the last has a finishReason.
    assert framed == [pieces[0], pieces[-1]]
    assert repair.report.usage.output_tokens == 3 * 299 + 2 and repair.report.finish_reasons == ["STOP"]


def test_gemini_array_elements_take_the_fast_path_after_the_second(framed):
    pieces = array_elements(_ai_studio_chunks(300))
    repair = StreamRepair(dialect=GEMINI, request=RequestFacts(json_array_stream=True))
    out = b"".join(repair.receive_data(piece) for piece in pieces) + repair.receive_end()
    assert out == b"".join(pieces) and repair.report.verdict == "clean"
    # `[{…}` and the first `,\r\n{…}` (it teaches the shape: no element but the first follows a
    # `[`), then the last chunk and the `]`.
    assert framed == [pieces[0], pieces[1], pieces[-2], pieces[-1]]


def test_code_assist_chunks_take_the_fast_path(framed):
    pieces = [b"data: " + json.dumps(code_assist(chunk)).encode() + b"\r\n\r\n" for chunk in _ai_studio_chunks(50)]
    repair = StreamRepair(dialect=GEMINI)
    assert b"".join(repair.receive_data(piece) for piece in pieces) + repair.receive_end() == b"".join(pieces)
    assert framed == [pieces[0], pieces[-1]] and repair.report.verdict == "clean"


@pytest.mark.parametrize("form", ["sse", "array"])
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_a_cut_after_steady_chunks_books_the_last_chunk_s_counts(form, end):
    chunks = _ai_studio_chunks(100, finish=None)
    pieces = (
        array_elements(chunks, closed=False)
        if form == "array"
        else [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    )
    for fast_path in (True, False):
        repair = StreamRepair(dialect=GEMINI, fast_path=fast_path)
        for piece in pieces:
            repair.receive_data(piece)
        tail = repair.receive_end() if end == "clean" else repair.receive_failure("reset").client_bytes
        assert b'"status":"UNAVAILABLE"' in tail and repair.report.verdict == "interrupted"
        assert repair.report.usage.output_tokens == 3 * 99 + 2 and repair.report.usage.input_tokens == 4


def test_g7_reads_the_count_of_the_last_chunk_the_steady_path_took():
    # The finishing chunk carries no usage of its own: `STOP` at the limit is read from the last
    # routine chunk's `candidatesTokenCount` (50), which only the steady path saw.
    chunks = gemini_chunks([f"t{n}" for n in range(50)], finish=None)
    pieces = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]
    pieces.append(b'data: {"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP", "index": 0}]}\n\n')
    for fast_path in (True, False):
        repair = StreamRepair(dialect=GEMINI, request=RequestFacts(max_tokens=50), fast_path=fast_path)
        out = b"".join(repair.receive_data(piece) for piece in pieces) + repair.receive_end()
        assert out.endswith(b'"finishReason": "MAX_TOKENS", "index": 0}]}\n\n'), fast_path
        assert repair.report.finish_reasons == ["MAX_TOKENS"]


def test_the_routine_gemini_chunk_is_learned_with_its_counts_as_gaps():
    routine = RoutineChunks(dialect=GEMINI)
    learned = b"data: " + json.dumps(gemini_chunks(["Hel"], finish=None)[0]).encode() + b"\n\n"
    data = learned[len(b"data: ") : -2]
    routine.learn(learned, data, json.loads(data), 1)
    other = gemini_chunk('lo "\u00e9" \n', tokens=12345)
    match = routine.maybe_match(b"data: " + json.dumps(other).encode() + b"\n\n")
    assert match is not None and match.has_text and match.index == 0
    assert match.counts == {"promptTokenCount": 4, "candidatesTokenCount": 12345, "totalTokenCount": 12349}
    assert match.steady is not None  # a counted shape's steady path
    for finish in ("STOP", "", None):
        chunk = gemini_chunks(["x"], finish=finish)[0]
        if finish is None:
            chunk["candidates"][0]["content"]["parts"].append({"functionCall": {"name": "f", "args": {}}})
        assert routine.maybe_match(b"data: " + json.dumps(chunk).encode() + b"\n\n") is None


@pytest.mark.parametrize(
    "chunk",
    [
        gemini_chunks(["a"])[0],  # a finishReason
        gemini_chunks(["a"], finish="")[0],  # an empty one (G3: none, but not routine)
        {"candidates": [{"content": {"parts": [{"text": "a"}, {"text": "b"}]}, "index": 0}]},
        {"candidates": [{"content": {"parts": [{"text": "a", "functionCall": {"name": "f"}}]}, "index": 0}]},
        {
            "candidates": [
                {"content": {"parts": [{"text": "a"}]}, "index": 0},
                {"content": {"parts": [{"text": "b"}]}, "index": 1},
            ]
        },
        {"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}], "promptFeedback": {"blockReason": "SAFETY"}},
        {"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}], "error": None},
        {"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}], "usageMetadata": {"promptTokenCount": -1}},
        {"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": None}]},
        {"candidates": [{"content": {"parts": [{"text": 1}]}, "index": 0}]},
    ],
)
def test_what_is_never_a_routine_gemini_chunk(chunk):
    routine = RoutineChunks(dialect=GEMINI)
    data = json.dumps(chunk).encode()
    routine.learn(b"data: " + data + b"\n\n", data, chunk, 0)
    assert not routine.learned


def test_only_the_usage_s_token_counts_are_gaps():
    # Another integer of the usage is a literal: a chunk where it changes is another shape.
    routine = RoutineChunks(dialect=GEMINI)
    chunks = gemini_chunks(["a", "b", "c"], finish=None)
    for number, chunk in enumerate(chunks):
        chunk["usageMetadata"]["someFutureCount"] = 7 if number < 2 else 8
    pieces = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]
    routine.learn(pieces[0], pieces[0][6:-2], chunks[0], 1)
    assert routine.maybe_match(pieces[1]).counts == {"promptTokenCount": 4, "candidatesTokenCount": 2, "totalTokenCount": 6}
    assert routine.maybe_match(pieces[2]) is None


def test_one_layout_s_steady_pattern_is_compiled_once_for_every_stream():
    # Streams of one server differ in their `responseId` (the tail), not in what lies between their
    # text and their last count: one pattern serves them all.
    def shape(response_id: bytes) -> tuple[list[bytes], list[str]]:
        return [_HEAD, _MIDDLE, _TOTAL, _TAIL_KEY, _TAIL[:-2] + response_id + b'"}\n\n'], ["text", "count", "count", "count"]

    first, second = counted_steady(*shape(b"a")), counted_steady(*shape(b"b"))
    assert first is not None and second is not None
    assert first[4] is second[4] and first[1] != second[1]


# -- counts that step: held, changed, back, across carries (`_steady.counted_steady`) -----------------


@st.composite
def _stepped_pieces(draw) -> list[bytes]:
    """Routine chunks whose counts follow steps: a step held for a run (one token per chunk: output
    and total +1, prompt +0; or any other, in any count), a step that changes, counts that step back
    (the next step would go below 0), starts at 8, 9, 98, 99, 998 (every carry, a count's length
    changing), with a piece of any bytes in a gap now and then, the text plain or escaped."""
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    counts = [draw(st.sampled_from([0, 4, 9, 99])), draw(st.sampled_from([0, 1, 8, 9, 98, 99, 998, 9999]))]
    counts.append(counts[0] + counts[1] + draw(st.sampled_from([0, 1, 9])))
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        steps = draw(st.sampled_from([(0, 1, 1), (0, 1, 1), (0, 2, 2), (1, 1, 2), (0, 0, 0), (0, -1, -1), (0, 7, 3)]))
        for _ in range(draw(st.integers(0, 25))):
            counts = [count + step for count, step in zip(counts, steps)]
            if min(counts) < 0:
                counts = [max(count, 0) for count in counts]
            text = draw(st.sampled_from([b'"tok "', b'"a\\nb"', b'"\\u00e9"', b'"x"']))
            prompt, output, total = (b"%d" % count for count in counts)
            pieces.append(_piece(text, prompt, output, total, ending))
        if draw(st.integers(0, 3)) == 0:
            gap = draw(st.sampled_from(["text", "prompt", "output", "total"]))
            fields = {"text": b'"x"', "prompt": b"%d" % counts[0], "output": b"%d" % counts[1], "total": b"%d" % counts[2]}
            fields[gap] = draw(_TEXT_BYTES if gap == "text" else _NUMBER_BYTES)
            pieces.append(_piece(fields["text"], fields["prompt"], fields["output"], fields["total"], ending))
    return pieces


@SETTINGS
@given(pieces=_stepped_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_when_counts_step_by_one_or_not(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=GEMINI)


@SETTINGS
@given(pieces=_stepped_pieces(), chunking=st.sampled_from(CHUNKINGS), seed=st.integers(0, 1000), end=_ENDS)
def test_stepped_counts_fed_whole_bytewise_and_at_random_splits(pieces, chunking, seed, end):
    _run_both(
        split(b"".join(pieces), chunking, seed), end, policy=RepairPolicy(), request=RequestFacts(max_tokens=40), dialect=GEMINI
    )


@pytest.mark.parametrize("end", ["clean", "failure"])
def test_counts_stepping_below_zero_or_past_18_digits_are_left_to_the_full_path(end):
    # A count no count gap takes (-1, 19 digits) after a run of steady chunks: such chunks are read
    # by the full path, which books them as it reads them.
    down = [_piece(b'"t"', b"4", b"%d" % count, b"%d" % (count + 4), b"\n") for count in range(6, -4, -1)]
    up = [_piece(b'"t"', b"4", b"%d" % count, b"7", b"\n") for count in range(10**18 - 5, 10**18 + 4)]
    for pieces in (down, up):
        _run_both(pieces, end, policy=RepairPolicy(), request=RequestFacts(), dialect=GEMINI)
