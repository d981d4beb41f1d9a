"""Invariants of the repair core, over generated streams and split points (hypothesis).

1. A well-formed stream comes out byte-identical, however it is chunked.
2. Whatever the upstream sends and however it ends, what the client gets is a well-formed event
   stream that ends (as a client reads it: up to the first [DONE] or error event) either in a finish
   for every choice and [DONE], or in an error event.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finishline import EventFramer, OnCut, RepairPolicy, RequestFacts, StreamRepair
from tests.feeding import chunk

ENDINGS = st.sampled_from([b"\n", b"\r\n", b"\r"])
TEXT = st.text(max_size=12)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame(data: dict | bytes, ending: bytes, space: bool = True) -> bytes:
    payload = data if isinstance(data, bytes) else json.dumps(data, ensure_ascii=False).encode()
    return b"data:" + (b" " if space else b"") + payload + ending + ending


@st.composite
def well_formed_streams(draw):
    ending = draw(ENDINGS)
    choices = draw(st.integers(min_value=1, max_value=3))
    events = [b": hello" + ending + ending] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        index = draw(st.integers(min_value=0, max_value=choices - 1))
        events.append(frame(chunk(draw(TEXT), index=index), ending, draw(st.booleans())))
    for index in draw(st.permutations(range(choices))):
        reason = draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))
        events.append(frame(chunk(index=index, finish_reason=reason), ending))
    if draw(st.booleans()):
        events.append(frame(chunk(choices=[], usage={"completion_tokens": 5}), ending))
    events.append(frame(b"[DONE]", ending))
    return b"".join(events)


@st.composite
def splits(draw, data: bytes):
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=max(1, len(data) - 1)), max_size=30)))
    pieces, last = [], 0
    for cut in cuts + [len(data)]:
        if cut > last:
            pieces.append(data[last:cut])
            last = cut
    return pieces


@given(st.data())
@SETTINGS
def test_well_formed_stream_is_byte_identical_under_any_chunking(data):
    stream = data.draw(well_formed_streams())
    repair = StreamRepair(request=RequestFacts(max_tokens=5))
    out = b"".join(repair.receive_data(piece) for piece in data.draw(splits(stream)))
    out += repair.receive_end()
    assert out == stream
    assert repair.report.verdict == "clean"


@st.composite
def any_stream(draw):
    ending = draw(ENDINGS)
    pieces = []
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        index = draw(st.integers(min_value=0, max_value=2))
        kind = draw(
            st.sampled_from(["content", "finish", "empty", "tool", "usage", "comment", "junk", "error", "done", "reasoning"])
        )
        pieces.append(
            {
                "content": lambda i: frame(chunk(draw(TEXT), index=i), ending),
                "reasoning": lambda i: frame(chunk(delta={"reasoning_content": draw(TEXT)}, index=i), ending),
                "finish": lambda i: frame(chunk(index=i, finish_reason="stop"), ending),
                "empty": lambda i: frame(chunk(draw(TEXT), index=i, finish_reason=""), ending),
                "tool": lambda i: frame(
                    chunk(delta={"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, index=i), ending
                ),
                "usage": lambda i: frame(chunk(choices=[], usage={"completion_tokens": draw(st.integers(0, 9))}), ending),
                "comment": lambda i: b": ping" + ending + ending,
                "junk": lambda i: frame(draw(st.binary(max_size=10)).replace(b"\n", b"").replace(b"\r", b""), ending),
                "error": lambda i: frame({"error": {"message": "boom"}}, ending),
                "done": lambda i: frame(b"[DONE]", ending),
            }[kind](index)
        )
    stream = b"".join(pieces)
    if draw(st.booleans()):  # cut anywhere
        stream = stream[: draw(st.integers(min_value=0, max_value=len(stream)))]
    return stream


def client_view(stream: bytes) -> list:
    """Events as a client reads them: up to and including the first [DONE] or error event."""
    framer = EventFramer()
    events = framer.receive_data(stream)
    leftover = framer.receive_end()
    seen = []
    for event in events:
        if event.data is None:
            continue
        if event.data.startswith(b"[DONE]"):
            seen.append("[DONE]")
            break
        try:
            parsed = json.loads(event.data)
        except ValueError:
            continue
        seen.append(parsed)
        if isinstance(parsed, dict) and "error" in parsed:
            break
    else:
        # Bytes after [DONE] or an upstream error event are passed on as sent; before, never.
        assert leftover is None, "the output must not end inside an event"
    return seen


@given(st.data())
@SETTINGS
def test_any_input_ends_in_finish_and_done_or_an_error_event(data):
    stream = data.draw(any_stream())
    policy = RepairPolicy(on_cut=data.draw(st.sampled_from([OnCut.ERROR, OnCut.STOP])))
    repair = StreamRepair(request=RequestFacts(max_tokens=5), policy=policy)
    out = b"".join(repair.receive_data(piece) for piece in data.draw(splits(stream)))
    cut = data.draw(st.booleans())
    out += repair.receive_failure("reset").client_bytes if cut else repair.receive_end()
    events = client_view(out)
    assert events, out
    last = events[-1]
    if isinstance(last, dict) and "error" in last:
        return
    assert last == "[DONE]", out
    # Like strict clients, a choice counts as finished once any chunk gave it a reason.
    seen, finished = set(), set()
    for event in events[:-1]:
        for choice in event.get("choices", []) if isinstance(event, dict) else []:
            if isinstance(choice, dict) and isinstance(choice.get("index"), int):
                seen.add(choice["index"])
                if choice.get("finish_reason"):
                    finished.add(choice["index"])
    assert seen == finished, out
