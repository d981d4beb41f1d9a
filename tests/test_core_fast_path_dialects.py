"""The fast path in the Messages and Responses dialects is held to the full parse: for generated
streams (runs of routine text deltas of any text, broken by every other kind of event, split or
merged anywhere, any line ending), both paths give the same bytes, the same stall checks and the
same report, whatever the end. A Responses cut's injected `sequence_number`s show that the fast path
kept the last one."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from finishline import Dialect, RepairPolicy, RequestFacts, StreamRepair
from finishline._routine_chunks import RoutineChunks
from labs.worker.frames import sse_frame
from labs.worker.wire import malformed_event
from tests.dialect_streams import messages_stream, responses_stream
from tests.feeding import CHUNKINGS, split
from tests.test_core_fast_path import _ENDS, _POLICIES, _REQUESTS, _TEXTS, SETTINGS, _run_both, counted, framed  # noqa: F401 (fixtures)

_ENDINGS = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def _messages_pieces(draw) -> list[bytes]:
    ending = draw(_ENDINGS)
    spaced = draw(st.booleans())  # some servers write `{"type": "x"}`, most compact JSON

    def frame(data: dict) -> bytes:
        if spaced:
            return b"event: " + data["type"].encode() + ending + b"data: " + json.dumps(data).encode() + ending + ending
        return sse_frame(data, event=data["type"], line_ending=ending)

    pieces = [frame({"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {"output_tokens": 1}}})]
    for block in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "thinking", "tool_use"]))
        delta_type, key = {
            "text": ("text_delta", "text"),
            "thinking": ("thinking_delta", "thinking"),
            "tool_use": ("input_json_delta", "partial_json"),
        }[kind]
        pieces.append(frame({"type": "content_block_start", "index": block, "content_block": {"type": kind}}))
        for text in draw(st.lists(_TEXTS, min_size=1, max_size=20)):
            pieces.append(frame({"type": "content_block_delta", "index": block, "delta": {"type": delta_type, key: text}}))
        other = draw(
            st.sampled_from(
                [
                    {"type": "ping"},
                    {"type": "content_block_stop", "index": block},
                    {"type": "content_block_delta", "index": block, "delta": {"type": "signature_delta", "signature": "s"}},
                    {"type": "error", "error": {"type": "overloaded_error", "message": "x"}},
                ]
            )
        )
        pieces.append(frame(other))
        if draw(st.integers(0, 3)) == 0:  # rule C8: booked malformed, by either path
            pieces.append(malformed_event(Dialect.MESSAGES, ending))
    tail = draw(st.sampled_from(["stop", "null", "none", "cut"]))
    if tail != "cut":
        reason = {"stop": "end_turn", "null": None, "none": ""}[tail]
        pieces += [
            frame({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 9}}),
            frame({"type": "message_stop"}),
        ]
    return _maybe_split(draw, pieces)


@st.composite
def _responses_pieces(draw) -> list[bytes]:
    ending = draw(_ENDINGS)
    obfuscated = draw(st.booleans())  # OpenAI pads every delta with a random `obfuscation` string
    # Servers that serialize their event models write the keys in alphabetical order: the text
    # before the sequence number.
    sort_keys = draw(st.booleans())
    # llama.cpp sends no `sequence_number`, `output_index` or `content_index` on any event (rule R7).
    indexed = draw(st.booleans())
    number = 0

    def frame(kind: str, **fields) -> bytes:
        nonlocal number
        data = {"type": kind, "sequence_number": number, **fields}
        number += 1
        if not indexed:
            data = {key: value for key, value in data.items() if key not in ("sequence_number", "output_index", "content_index")}
        if sort_keys:
            data = dict(sorted(data.items()))
        return sse_frame(data, event=kind, line_ending=ending)

    pieces = [frame("response.created", response={"id": "resp_1", "status": "in_progress", "output": []})]
    for item in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta"]
            )
        )
        pieces.append(frame("response.output_item.added", output_index=item, item={"id": f"it_{item}"}))
        for text in draw(st.lists(_TEXTS, min_size=1, max_size=20)):
            extra = {"obfuscation": draw(st.text(max_size=6))} if obfuscated else {}
            pieces.append(frame(kind, item_id=f"it_{item}", output_index=item, content_index=0, delta=text, **extra))
            if draw(st.integers(0, 30)) == 0:
                number += draw(st.integers(1, 3))  # a gap in the numbering: the last one seen still counts
            if draw(st.integers(0, 30)) == 0:  # rule C8: booked malformed, by either path
                pieces.append(malformed_event(Dialect.RESPONSES, ending))
        pieces.append(
            frame(
                draw(st.sampled_from(["response.output_text.done", "response.output_item.done", "response.some_future_event"])),
                output_index=item,
            )
        )
    tail = draw(st.sampled_from(["response.completed", "response.incomplete", "response.failed", "cut"]))
    if tail != "cut":
        # `completed` at the limit some draws ask for (rule R6), or another status.
        status = draw(st.sampled_from(["completed", "x"]))
        usage = {"output_tokens": draw(st.integers(2, 4))}
        pieces.append(frame(tail, response={"id": "resp_1", "status": status, "usage": usage}))
    return _maybe_split(draw, pieces)


def _maybe_split(draw, pieces: list[bytes]) -> list[bytes]:
    """Mostly one event per piece (how servers send them), sometimes one split or two merged."""
    out: list[bytes] = []
    for piece in pieces:
        choice = draw(st.integers(0, 9))
        if choice == 0 and len(piece) > 1:
            at = draw(st.integers(1, len(piece) - 1))
            out += [piece[:at], piece[at:]]
        elif choice == 1 and out:
            out[-1] += piece
        else:
            out.append(piece)
    return out


@SETTINGS
@given(pieces=_messages_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_messages_streams(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=Dialect.MESSAGES)


@SETTINGS
@given(pieces=_responses_pieces(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_responses_streams(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=Dialect.RESPONSES)


def _text_delta(dialect: Dialect, text: str, number: int) -> bytes:
    data: dict[str, Any]
    if dialect is Dialect.MESSAGES:
        data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    else:
        data = {
            "type": "response.output_text.delta",
            "sequence_number": number,
            "item_id": "m",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        }
    return sse_frame(data, event=data["type"])


def test_the_routine_deltas_of_each_dialect_are_learned_and_matched():
    for dialect in (Dialect.MESSAGES, Dialect.RESPONSES):
        routine = RoutineChunks(dialect=dialect)
        learned = _text_delta(dialect, "Hel", 3)
        data = learned.split(b"data: ", 1)[1].rstrip(b"\n")
        routine.learn(learned, data, json.loads(data), 1)
        match = routine.maybe_match(_text_delta(dialect, "lo \u00e9\\n", 4))
        assert match is not None and match.has_text
        assert match.number == (4 if dialect is Dialect.RESPONSES else None)
        assert routine.maybe_match(_text_delta(dialect, "", 5)).has_text is False
        # Messages' shape is one gap: the machine's steady path takes the next pieces.
        assert (match.steady is not None) == (dialect is Dialect.MESSAGES)


def test_a_responses_cut_after_fast_path_deltas_continues_the_last_sequence_number():
    pieces = [sse_frame({"type": "response.created", "sequence_number": 0, "response": {"id": "r"}}, event="response.created")]
    pieces += [_text_delta(Dialect.RESPONSES, f"t{number}", number) for number in range(1, 200)]
    for fast_path in (True, False):
        repair = StreamRepair(dialect=Dialect.RESPONSES, fast_path=fast_path)
        for piece in pieces:
            repair.receive_data(piece)
        ending = repair.receive_end()
        numbers = [
            json.loads(line[len(b"data: ") :])["sequence_number"] for line in ending.splitlines() if line.startswith(b"data: ")
        ]
        assert numbers == [200, 201]


def test_the_worker_streams_take_the_fast_path_after_their_first_delta(framed):
    texts = [f" w{number % 7}" for number in range(300)]
    for dialect, pieces in ((Dialect.MESSAGES, messages_stream(texts)), (Dialect.RESPONSES, responses_stream(texts))):
        framed.clear()
        repair = StreamRepair(started_at=0.0, dialect=dialect)
        out = b"".join(repair.receive_data(piece, now=1.0) for piece in pieces) + repair.receive_end(now=2.0)
        assert out == b"".join(pieces) and repair.report.verdict == "clean"
        first_delta = next(number for number, piece in enumerate(pieces) if b"w0" in piece)
        # Everything up to the first text delta is read in full (it teaches the shape), the other
        # 299 deltas are not, and whatever follows them is.
        assert framed[: first_delta + 1] == pieces[: first_delta + 1]
        assert len(framed) == len(pieces) - 299, dialect


def test_responses_deltas_with_their_keys_in_alphabetical_order_take_the_fast_path_too(framed):
    # vLLM and other servers that serialize their event models write the text before the number.
    def delta(number: int) -> bytes:
        data: dict[str, Any] = {
            "type": "response.output_text.delta",
            "sequence_number": number,
            "item_id": "m",
            "output_index": 0,
            "content_index": 0,
            "delta": f" w{number % 7}",
            "logprobs": [],
        }
        return sse_frame(dict(sorted(data.items())), event=data["type"])

    pieces = [sse_frame({"type": "response.created", "sequence_number": 0, "response": {"id": "r"}}, event="response.created")]
    pieces += [delta(number) for number in range(1, 301)]
    repair = StreamRepair(dialect=Dialect.RESPONSES)
    out = b"".join(repair.receive_data(piece) for piece in pieces)
    # The created event and the first delta (it teaches the shape) are read in full; the other 299
    # are not.
    assert out == b"".join(pieces) and len(framed) == 2
    numbers = [
        json.loads(line[len(b"data: ") :])["sequence_number"]
        for line in repair.receive_end().splitlines()
        if line.startswith(b"data: ")
    ]
    assert numbers == [301, 302]


# -- the steady path of numbered and padded Responses deltas (`SteadyShape`) --------------------------

_PLAIN_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)
# Where a run's numbers start: around the carries the steady path writes in place (9 -> 10, 99 -> 100...).
_FIRST_NUMBERS = st.sampled_from([0, 1, 5, 8, 9, 10, 89, 95, 98, 99, 100, 990, 997, 999, 9998, 99_995, 10**17 - 3])


@st.composite
def _responses_runs(draw) -> list[bytes]:
    """Long runs of one Responses delta shape (what the steady path takes): numbers one by one across
    their carries, sometimes a gap, a repeat or a step back, sometimes text or padding the steady
    path does not take, runs broken by other events."""
    ending = draw(_ENDINGS)
    sort_keys = draw(st.booleans())  # the number after the text (in the tail) rather than before it
    padded = draw(st.booleans())
    number = draw(_FIRST_NUMBERS)

    def frame(kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": number, **fields}
        return sse_frame(dict(sorted(data.items())) if sort_keys else data, event=kind, line_ending=ending)

    pieces = [frame("response.created", response={"id": "resp_1", "status": "in_progress", "output": []})]
    for run in range(draw(st.integers(1, 3))):
        number += 1
        pieces.append(frame("response.output_item.added", output_index=run, item={"id": f"it_{run}"}))
        for text in draw(st.lists(st.one_of(_PLAIN_TEXT, _PLAIN_TEXT, _TEXTS), min_size=1, max_size=30)):
            number += draw(st.sampled_from([1] * 20 + [0, 2, 7, -1, -3]))
            number = max(number, 0)
            extra = {"obfuscation": draw(st.one_of(_PLAIN_TEXT, _TEXTS))} if padded else {}
            pieces.append(
                frame("response.output_text.delta", item_id=f"it_{run}", output_index=run, content_index=0, delta=text, **extra)
            )
        number += 1
        pieces.append(frame(draw(st.sampled_from(["response.output_text.done", "response.some_future_event"])), output_index=run))
    if draw(st.booleans()):
        number += 1
        pieces.append(frame("response.completed", response={"id": "resp_1", "status": "completed"}))
    return pieces


@SETTINGS
@given(pieces=_responses_runs(), end=_ENDS, policy=_POLICIES, request=_REQUESTS)
def test_fast_and_full_paths_agree_on_runs_of_numbered_and_padded_deltas(pieces, end, policy, request):
    _run_both(pieces, end, policy=policy, request=request, dialect=Dialect.RESPONSES)


@SETTINGS
@given(pieces=_responses_runs(), chunking=st.sampled_from(CHUNKINGS), seed=st.integers(0, 1000), end=_ENDS)
def test_runs_of_numbered_deltas_fed_whole_bytewise_and_at_random_splits(pieces, chunking, seed, end):
    _run_both(
        split(b"".join(pieces), chunking, seed), end, policy=RepairPolicy(), request=RequestFacts(), dialect=Dialect.RESPONSES
    )


@SETTINGS
@given(
    number_first=st.booleans(),
    padded=st.booleans(),
    start=_FIRST_NUMBERS,
    numbers=st.lists(
        st.one_of(
            st.sampled_from([b"0", b"00", b"007", b"-1", b"1e3", b"1.0", b" 5", b"5 ", b"99999999999999999999", b'"5"', b"null"]),
            st.binary(max_size=6),
        ),
        min_size=1,
        max_size=8,
    ),
    end=_ENDS,
)
def test_a_numbered_shape_s_number_gap_holding_any_bytes(number_first, padded, start, numbers, end):
    """A numbered shape taught and taken, then pieces that are it but for the number's bytes: any
    bytes, the predicted number written otherwise (leading zeros, an exponent), or a number next to
    it; each followed by a delta numbered on from the one before it."""
    head = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    number_key, text_key = b'"sequence_number":', b'"item_id":"m","output_index":0,"content_index":0,"delta":'
    tail = (b',"obfuscation":"pad"' if padded else b"") + b"}\n\n"

    def delta(number: bytes, text: bytes = b'"t"') -> bytes:
        if number_first:
            return head + number_key + number + b"," + text_key + text + tail
        return head + text_key + text + b"," + number_key + number + tail

    created = sse_frame({"type": "response.created", "sequence_number": 0, "response": {"id": "r"}}, event="response.created")
    pieces = [created] + [delta(b"%d" % (start + step)) for step in range(4)]
    last = start + 3
    for number in numbers:
        pieces.append(delta(number))
        last += 1
        pieces += [delta(b"%d" % (last + step)) for step in range(1, 3)]
        last += 2
    _run_both(pieces, end, policy=RepairPolicy(), request=RequestFacts(), dialect=Dialect.RESPONSES)


def test_the_steady_path_takes_numbered_deltas_across_every_carry_and_hands_on_the_last_number(framed, counted):
    # The numbers cross 9, 99 and 999 (the literal grows by a digit); every delta after the first
    # (it teaches the shape) is taken without the framer, and every one after the second (the fast
    # path's match starts the steady path) by the steady path, padded or not, its number before
    # the text or after it.
    for sort_keys, padded in ((False, False), (False, True), (True, False), (True, True)):
        framed.clear()
        counted.matched = 0
        pieces = [
            sse_frame({"type": "response.created", "sequence_number": 0, "response": {"id": "r"}}, event="response.created")
        ]
        for number in range(1, 1202):
            data = {"type": "response.output_text.delta", "sequence_number": number, "item_id": "m", "output_index": 0}
            data |= {"content_index": 0, "delta": f" w{number}"}
            if padded:
                data["obfuscation"] = "x" * (number % 5 + 1)
            pieces.append(sse_frame(dict(sorted(data.items())) if sort_keys else data, event=data["type"]))
        repair = StreamRepair(dialect=Dialect.RESPONSES)
        out = b"".join(repair.receive_data(piece) for piece in pieces)
        assert out == b"".join(pieces)
        numbers = [
            json.loads(line[len(b"data: ") :])["sequence_number"]
            for line in repair.receive_end().splitlines()
            if line.startswith(b"data: ")
        ]
        assert numbers == [1202, 1203]
        assert framed == pieces[:2], (sort_keys, padded)
        assert counted.matched == 1, (sort_keys, padded)
