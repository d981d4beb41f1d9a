"""`layout_from_capture`: where the head and each token event end in a captured raw response.

The oracle is the simulated worker's `ResponsePlan`, which knows every byte it sends from its
settings (labs/worker/wire.py) and shares no code with the capture reader. Hand-built captures cover
what the worker never sends: several events in a chunk, an event across chunks, chunk extensions,
every SSE line ending, a keep-alive before the first token, and the malformed captures that must be
refused. Pure: no sockets, no processes.
"""

from __future__ import annotations

import pytest

from faults.layout import _FEED_SIZE, LayoutError, is_token_event, layout_from_capture
from labs.worker import WorkerSettings
from labs.worker.settings import Finish, Framing
from tests.feeding import chunk, sse
from tests.fixtures_lab import request_for

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
CHUNKED_HEAD = SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n"
CLOSE_HEAD = SSE_HEAD + b"connection: close\r\n\r\n"
ROLE = sse(chunk(delta={"role": "assistant", "content": ""}))
ROLE_CHUNK_HEADER = b"%x\r\n" % len(ROLE)
#: h11's words for a body that ends before its framing says it does.
CUT_SHORT = "peer closed connection without sending complete message body"
FINISH = sse(chunk(finish_reason="stop"))
DONE = sse(b"[DONE]")


def http_chunk(payload: bytes) -> bytes:
    """One chunk of a chunked body (RFC 9112 section 7.1), without extensions."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def chunked(*payloads: bytes) -> bytes:
    """A chunked body: one chunk per payload, then the last chunk."""
    return b"".join(http_chunk(payload) for payload in payloads) + b"0\r\n\r\n"


def settings_cases():
    for framing in Framing:
        for include_usage in (False, True):
            for tokens in (0, 1, 7, 100):
                yield WorkerSettings(tokens=tokens, include_usage=include_usage, framing=framing)
    yield WorkerSettings(tokens=5, reasoning_tokens=3)
    yield WorkerSettings(tokens=4, tool_calls=2, framing=Framing.CONTENT_LENGTH)
    yield WorkerSettings(tokens=6, max_tokens=3, framing=Framing.CLOSE)
    yield WorkerSettings(tokens=4, finish=Finish.OMITTED, done=False)
    yield WorkerSettings(tokens=4, connection_close=True)


@pytest.mark.parametrize("settings", list(settings_cases()), ids=lambda s: s.to_model_name())
def test_a_captured_worker_response_ends_its_token_events_where_the_worker_says(settings):
    _, plan = request_for(settings)

    layout = layout_from_capture(plan.to_bytes())

    assert layout.head_length == plan.head_length
    assert layout.token_events == plan.token_events
    assert [layout.offset_after_tokens(n) for n in range(plan.token_events + 1)] == [
        plan.offset_after_tokens(n) for n in range(plan.token_events + 1)
    ]
    assert layout.total_length == len(plan.to_bytes())


def test_an_event_that_ends_inside_a_chunk_ends_there_and_one_that_ends_a_chunk_takes_its_crlf():
    first, second = sse(chunk("Hel")), sse(chunk("lo"))
    body = chunked(ROLE + first + second, FINISH + DONE)
    raw = CHUNKED_HEAD + body
    chunk_data_start = len(CHUNKED_HEAD) + len(b"%x\r\n" % len(ROLE + first + second))

    layout = layout_from_capture(raw)

    assert layout.head_length == len(CHUNKED_HEAD)
    # The role event ends inside the first chunk: a cut after 0 tokens keeps it, and no framing.
    assert layout.offset_after_tokens(0) == chunk_data_start + len(ROLE)
    assert layout.offset_after_tokens(1) == chunk_data_start + len(ROLE + first)
    # The second token ends the chunk: its CRLF goes with it, so the cut leaves whole chunks.
    assert layout.offset_after_tokens(2) == chunk_data_start + len(ROLE + first + second) + 2
    assert raw[: layout.offset_after_tokens(2)].endswith(second + b"\r\n")


def test_an_event_split_across_chunks_ends_in_the_chunk_that_completes_it():
    token = sse(chunk("Hi"))
    raw = CHUNKED_HEAD + chunked(ROLE, token[:10], token[10:], FINISH)

    layout = layout_from_capture(raw)

    assert layout.token_events == 1
    assert raw[: layout.offset_after_tokens(1)].endswith(http_chunk(token[10:]))


def test_chunk_extensions_and_upper_case_sizes_are_framing_not_data():
    token = sse(chunk("Hi"))
    body = b"%X;name=value\r\n%s\r\n" % (len(ROLE), ROLE) + b"%X;q=1\r\n%s\r\n0\r\n\r\n" % (len(token), token)
    raw = CHUNKED_HEAD + body

    layout = layout_from_capture(raw)

    assert layout.offset_after_tokens(0) == raw.index(ROLE) + len(ROLE) + 2
    assert layout.offset_after_tokens(1) == len(raw) - len(b"0\r\n\r\n")


def test_offsets_do_not_depend_on_where_the_capture_is_sliced_for_h11():
    # The capture reaches h11 in slices of `_FEED_SIZE` bytes; move the first slice's edge across
    # every byte of two chunks (one holding two events, one holding one) and their framing.
    first, second, third = sse(chunk("a")), sse(chunk("bb")), sse(chunk("ccc"))
    pair_chunk = http_chunk(first + second)
    third_chunk = http_chunk(third)
    for edge in range(-4, len(pair_chunk + third_chunk) + 4):
        # A comment line in the role event moves what follows it, so that the slice edge falls
        # `edge` bytes after the role chunk, and keeps the event a role event.
        role_chunk_end = _FEED_SIZE - edge
        padding = role_chunk_end - len(CHUNKED_HEAD) - len(b"fff\r\n: \n\r\n") - len(ROLE)
        role = b": " + b"p" * padding + b"\n" + ROLE
        role_chunk = http_chunk(role)
        assert len(CHUNKED_HEAD + role_chunk) == role_chunk_end
        raw = CHUNKED_HEAD + role_chunk + pair_chunk + third_chunk + chunked(FINISH)
        pair_data_start = role_chunk_end + len(b"%x\r\n" % len(first + second))

        layout = layout_from_capture(raw)

        assert (layout.preamble_end, layout.token_event_ends) == (
            role_chunk_end,
            (
                pair_data_start + len(first),
                role_chunk_end + len(pair_chunk),
                role_chunk_end + len(pair_chunk + third_chunk),
            ),
        ), f"slice edge {edge} bytes after the role chunk"


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_a_token_event_ends_after_its_blank_line_whatever_the_line_ending(ending):
    events = [sse(value, ending=ending) for value in (chunk(delta={"role": "assistant"}), chunk("a"), chunk("b"))]
    raw = CLOSE_HEAD + b"".join(events) + sse(b"[DONE]", ending=ending)

    layout = layout_from_capture(raw)

    ends = [len(CLOSE_HEAD + b"".join(events[: i + 1])) for i in range(3)]
    assert [layout.offset_after_tokens(n) for n in range(3)] == ends


def test_data_without_the_space_and_on_several_lines_is_read_as_one_event():
    token = b'data:{"choices": [{"index": 0,\ndata: "delta": {"content": "x"}}]}\n\n'
    raw = CLOSE_HEAD + ROLE + token + DONE

    layout = layout_from_capture(raw)

    assert layout.token_events == 1
    assert layout.offset_after_tokens(1) == len(CLOSE_HEAD + ROLE + token)


def test_the_preamble_is_the_role_events_before_anything_else():
    keep_alive = b": keep-alive\n\n"
    token = sse(chunk("a"))
    # A keep-alive first: the preamble stops at the head (the cut keeps no event it cannot name).
    assert layout_from_capture(CLOSE_HEAD + keep_alive + ROLE + token + DONE).offset_after_tokens(0) == len(CLOSE_HEAD)
    # Two role events, then a token: both are kept by a cut after 0 tokens.
    assert layout_from_capture(CLOSE_HEAD + ROLE + ROLE + token + DONE).offset_after_tokens(0) == len(CLOSE_HEAD + ROLE + ROLE)
    # A role-shaped event after the first token is not preamble, and not a token either.
    layout = layout_from_capture(CLOSE_HEAD + token + ROLE + token + DONE)
    assert layout.offset_after_tokens(0) == len(CLOSE_HEAD)
    assert layout.token_event_ends == (len(CLOSE_HEAD + token), len(CLOSE_HEAD + token + ROLE + token))


def test_an_event_without_its_blank_line_at_the_end_is_not_counted():
    raw = CLOSE_HEAD + ROLE + sse(chunk("a")) + b'data: {"choices": [{"delta": {"content": "b"}}]}\n'

    assert layout_from_capture(raw).token_events == 1


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        ({"role": "assistant", "content": ""}, False),
        ({"content": "x"}, True),
        ({"reasoning_content": "x"}, True),
        ({"reasoning": "x"}, True),
        ({"refusal": "x"}, True),
        ({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, True),
        ({"function_call": {"arguments": "{"}}, True),
        ({}, False),
    ],
)
def test_a_token_event_is_a_delta_with_a_non_empty_token_key(delta, expected):
    assert is_token_event(sse(chunk(delta=delta)).removeprefix(b"data: ").strip().decode()) is expected
    assert is_token_event("[DONE]") is False


def test_a_cut_after_more_tokens_than_captured_is_refused():
    layout = layout_from_capture(CLOSE_HEAD + ROLE + sse(chunk("a")) + DONE)

    with pytest.raises(ValueError, match="the captured stream has 1 token events, cannot cut after 2"):
        layout.offset_after_tokens(2)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        layout.offset_after_tokens(-1)


@pytest.mark.parametrize(
    "raw",
    [b"", b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n", b"not http at all\r\n\r\n"],
    ids=["empty", "head-cut-short", "not-http"],
)
def test_a_capture_without_a_complete_head_is_refused(raw):
    with pytest.raises(LayoutError, match="^the capture has no complete response head"):
        layout_from_capture(raw)


@pytest.mark.parametrize(
    ("body", "read", "message"),
    [
        (b"zz\r\n" + ROLE + b"\r\n0\r\n\r\n", 0, "illegal chunk header"),
        (ROLE_CHUNK_HEADER + ROLE + b"XY0\r\n\r\n", len(ROLE_CHUNK_HEADER + ROLE), "malformed chunk footer"),
        (ROLE_CHUNK_HEADER + ROLE + b"\r\n", len(ROLE_CHUNK_HEADER + ROLE), CUT_SHORT),
        (b"%x\r\n%s" % (len(ROLE) + 10, ROLE), len(ROLE_CHUNK_HEADER + ROLE), CUT_SHORT),
    ],
    ids=["bad-size", "no-crlf-after-data", "no-last-chunk", "chunk-cut-short"],
)
def test_a_malformed_or_incomplete_chunked_body_is_refused_with_where_it_broke(body, read, message):
    raw = CHUNKED_HEAD + body
    # `read`: the body bytes h11 took as good before it stopped (the head is always read).
    expected = (
        f"^the capture's body is not a complete HTTP/1.1 body: h11 read {len(CHUNKED_HEAD) + read} of its "
        f"{len(raw)} bytes, then: {message}"
    )

    with pytest.raises(LayoutError, match=expected):
        layout_from_capture(raw)


def test_a_content_length_body_cut_short_is_refused():
    raw = SSE_HEAD + b"content-length: %d\r\n\r\n" % (len(ROLE) + 1) + ROLE

    with pytest.raises(LayoutError, match=f"h11 read {len(raw)} of its {len(raw)} bytes, then: peer closed connection"):
        layout_from_capture(raw)
