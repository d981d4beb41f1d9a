"""What the dialects share: cuts after n token events, framing, routes, the builders, the new knobs."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.worker import WorkerSettings, open_worker, parse_settings, response_plan
from labs.worker.answer import dialect_reason, expected_answer
from labs.worker.settings import Finish, Framing
from tests.dialect_streams import messages_stream, responses_stream, token_texts_of
from tests.feeding import complete_events
from tests.fixtures_lab import chat_request, client_exchange, run_trio, split_response
from tests.test_worker_wire import read_with_h11

DIALECTS = list(LAB_DIALECTS)
NEW_DIALECTS = [Dialect.MESSAGES, Dialect.RESPONSES]
PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}


def plan_in(dialect: Dialect, stream: bool = True, **knobs):
    return response_plan(WorkerSettings(**knobs).for_request({"model": "m"}, dialect), stream=stream, dialect=dialect)


# -- cuts after n token events --------------------------------------------------------------------

endings = st.sampled_from(
    [{}, {"finish": Finish.OMITTED}, {"finish": Finish.EMPTY}, {"done": False}, {"null_reason": True},
     {"error_after": 3}, {"error_after": 3, "bare_error": True}, {"close_after_reasoning": True}, {"max_tokens": 5}]
)  # fmt: skip


@settings(max_examples=80)
@given(
    dialect=st.sampled_from(DIALECTS),
    tokens=st.integers(0, 12),
    reasoning_tokens=st.integers(0, 3),
    tool_calls=st.integers(0, 2),
    framing=st.sampled_from(Framing),
    ending=endings,
)
def test_offset_after_tokens_cuts_after_exactly_n_token_events(dialect, tokens, reasoning_tokens, tool_calls, framing, ending):
    assume(not (dialect is Dialect.GEMINI and ending == {"done": False}))  # refused: Gemini has no terminator
    knobs = dict(tokens=tokens, reasoning_tokens=reasoning_tokens, tool_calls=tool_calls, framing=framing, **ending)
    plan = plan_in(dialect, **knobs)
    raw = plan.to_bytes()
    answer_events = expected_answer(WorkerSettings(**knobs).for_request({}, dialect)).token_events
    if dialect is Dialect.GEMINI:
        # A call is one whole `functionCall` part, one event for its opening and argument pieces
        # (labs/worker/gemini_events.py); a call cut short is not sent.
        assert plan.token_events <= answer_events
    else:
        assert plan.token_events == answer_events
    offsets = [plan.offset_after_tokens(k) for k in range(plan.token_events + 1)]
    assert offsets == sorted(set(offsets))
    all_texts = token_texts_of(dialect, split_response(raw)[1])
    assert len(all_texts) == plan.token_events
    for k, offset in enumerate(offsets):
        body = split_response(raw[:offset])[1]
        assert token_texts_of(dialect, body) == all_texts[:k]
        if k:  # the cut ends right after the k-th token event, nothing of what follows it
            assert token_texts_of(dialect, last_event(body, dialect)) == all_texts[k - 1 : k]
    with pytest.raises(ValueError, match="cannot cut after"):
        plan.offset_after_tokens(plan.token_events + 1)


def last_event(body: bytes, dialect: Dialect = Dialect.CHAT) -> bytes:
    """The last complete SSE event of a body the worker wrote (LF line endings; Gemini's CRLF)."""
    end = b"\r\n\r\n" if dialect is Dialect.GEMINI else b"\n\n"
    events = body.split(end)
    return events[-2] + end if len(events) >= 2 else b""


@pytest.mark.parametrize("dialect", NEW_DIALECTS)
def test_before_the_first_token_everything_is_role(dialect):
    plan = plan_in(dialect, tokens=3, reasoning_tokens=1)
    first_token = [s.kind for s in plan.segments].index("token")
    assert {s.kind for s in plan.segments[:first_token]} == {"role"}
    assert plan.offset_after_tokens(0) == plan.head_length + sum(plan.framed_lengths[:first_token])


@pytest.mark.parametrize("dialect", NEW_DIALECTS)
def test_the_terminator_is_done_and_the_error_is_error(dialect):
    assert plan_in(dialect, tokens=2).segments[-1].kind == "done"
    assert plan_in(dialect, tokens=2, error_after=1, done=False).segments[-1].kind == "error"


# -- framing and determinism ----------------------------------------------------------------------


@pytest.mark.parametrize("framing", list(Framing))
@pytest.mark.parametrize("dialect", NEW_DIALECTS)
@pytest.mark.parametrize("stream", [True, False])
def test_every_framing_parses_as_http_in_every_dialect(framing, dialect, stream):
    plan = plan_in(dialect, stream, tokens=4, reasoning_tokens=1, tool_calls=1, framing=framing)
    response, body = read_with_h11(plan.to_bytes())
    assert response.status_code == 200
    assert body == b"".join(s.event for s in plan.segments)
    assert plan.to_bytes() == plan_in(dialect, stream, tokens=4, reasoning_tokens=1, tool_calls=1, framing=framing).to_bytes()


def test_dialect_reason_words():
    assert [dialect_reason(r, Dialect.MESSAGES) for r in ("stop", "length", "tool_calls", None)] == [
        "end_turn", "max_tokens", "tool_use", None,
    ]  # fmt: skip
    assert [dialect_reason(r, Dialect.RESPONSES) for r in ("stop", "length", "tool_calls")] == [
        "completed", "incomplete", "completed",
    ]  # fmt: skip
    assert dialect_reason("length", Dialect.CHAT) == "length"


# -- the tests' builders are the worker's ---------------------------------------------------------


def test_the_scripted_streams_are_the_workers_streams_for_the_same_answer():
    words = ["The", " quick", " brown"]
    worker = {d: [s.event for s in plan_in(d, tokens=3, model="e2e-model", prompt_tokens=0).segments] for d in NEW_DIALECTS}
    assert messages_stream(words) == worker[Dialect.MESSAGES]
    assert responses_stream(words) == worker[Dialect.RESPONSES]


def test_the_scripted_streams_take_line_endings_and_defects():
    crlf = b"".join(messages_stream(["a"], line_ending=b"\r\n"))
    assert b"\n" not in crlf.replace(b"\r\n", b"")
    assert token_texts_of(Dialect.MESSAGES, crlf) == ["a"]
    assert b"message_stop" not in b"".join(messages_stream(["a"], message_stop=False))
    assert b"response.completed" not in b"".join(responses_stream(["a"], terminal=None))
    assert responses_stream(["a"], done_marker=True)[-1] == b"data: [DONE]\n\n"


# -- the new knobs in Chat ------------------------------------------------------------------------


def test_chat_null_reason_sends_the_final_chunk_with_a_null_reason():
    events = complete_events(split_response(plan_in(Dialect.CHAT, tokens=2, null_reason=True).to_bytes())[1])
    final = json.loads(events[-2])
    assert final["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}
    assert events[-1] == "[DONE]"


def test_chat_close_after_reasoning_ends_after_the_reasoning():
    plan = plan_in(Dialect.CHAT, tokens=4, reasoning_tokens=2, n=2, close_after_reasoning=True)
    assert [s.kind for s in plan.segments][-1] == "token"
    assert token_texts_of(Dialect.CHAT, split_response(plan.to_bytes())[1]) == ["Let", "Let", " me", " me"]
    assert [c.finish_reason for c in plan.answer.choices] == [None, None]


def test_chat_bare_error_changes_nothing():
    assert (
        split_response(plan_in(Dialect.CHAT, tokens=4, error_after=2, bare_error=True).to_bytes())[1]
        == split_response(plan_in(Dialect.CHAT, tokens=4, error_after=2).to_bytes())[1]
    )


# -- routes over a socket -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1/messages", Dialect.MESSAGES),
        ("/anthropic/v1/messages", Dialect.MESSAGES),
        ("/v1/messages/", Dialect.MESSAGES),
        ("/v1/responses", Dialect.RESPONSES),
        ("/openai/v1/responses", Dialect.RESPONSES),
    ],
)
def test_the_wire_carries_exactly_the_planned_bytes_on_each_route(path, dialect):
    body = {"model": "c0042;tokens=4;reasoning_tokens=1;tool_calls=1", "stream": True, "max_tokens": 50}
    plan = response_plan(parse_settings(body["model"]).for_request(body, dialect), dialect=dialect)

    async def scenario():
        async with open_worker() as worker:
            received = await client_exchange(worker.port, chat_request(body, path=path, headers={"connection": "close"}))
            return received, list(worker.handled), list(worker.arrivals)

    received, handled, arrivals = run_trio(scenario)
    assert received.data == plan.to_bytes()
    assert (handled[0].dialect, handled[0].path, arrivals) == (dialect, path, [body["model"]])


def test_count_tokens_and_unknown_paths_are_not_routed():
    async def scenario():
        async with open_worker() as worker:
            request = chat_request({"model": "m"}, path="/v1/messages/count_tokens", headers={"connection": "close"})
            received = await client_exchange(worker.port, request)
            return received, list(worker.handled), list(worker.arrivals)

    received, handled, arrivals = run_trio(scenario)
    assert split_response(received.data)[0].startswith("HTTP/1.1 404 ")
    assert (handled[0].dialect, arrivals) == (None, [])


def test_a_bad_setting_on_the_messages_route_gets_anthropics_error_body():
    async def scenario():
        async with open_worker() as worker:
            request = chat_request({"model": "m;colour=red"}, path="/v1/messages", headers={"connection": "close"})
            return await client_exchange(worker.port, request)

    head, body = split_response(run_trio(scenario).data)
    assert head.startswith("HTTP/1.1 400 ")
    error = json.loads(body)
    assert error["type"] == "error" and "unknown worker setting 'colour'" in error["error"]["message"]
