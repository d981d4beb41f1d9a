"""The worker's attempt records, its refusal of stale cells, and the conduct faults (issue 14), over
real sockets: each fault's first and second attempt through httpx, one retry through openai-python."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import openai
import pytest
import trio

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.scenario import CELL_ID_TEMPLATE
from labs.worker import Attempt, WorkerSettings, attempts_of, open_worker, response_plan
from labs.worker.attempts import request_cell_id
from labs.worker.wire import MALFORMED_EVENTS
from tests.fixtures_lab import chat_request, client_exchange, run_trio

CELL = CELL_ID_TEMPLATE.format(7)
OTHER = CELL_ID_TEMPLATE.format(8)
PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}
#: The line ending of the worker's SSE frames, by dialect (Gemini's are Google's CRLF).
EVENT_END = {dialect: "\r\n\r\n" if dialect is Dialect.GEMINI else "\n\n" for dialect in LAB_DIALECTS}


def model(cell: str, **settings: Any) -> str:  # WorkerSettings' fields, as keywords
    return WorkerSettings(**settings).to_model_name(cell)


def body(cell: str, dialect: Dialect = Dialect.CHAT, *, stream: bool = True, **settings: object) -> dict:
    """A request in `dialect` (Gemini's `model` and `stream` go to its path: `wire`)."""
    if dialect is Dialect.GEMINI:
        contents = [{"role": "user", "parts": [{"text": "hi"}]}]
        return {
            "model": model(cell, **settings),
            "stream": stream,
            "contents": contents,
            "generationConfig": {"maxOutputTokens": 100},
        }
    request = {"model": model(cell, **settings), "stream": stream, "max_tokens": 100}
    key = "input" if dialect is Dialect.RESPONSES else "messages"
    request[key] = [{"role": "user", "content": "hi"}]
    return request


def wire(dialect: Dialect, request: dict) -> tuple[str, dict]:
    """The request's path and JSON body as a client sends them: Gemini's path names the model
    (escaped, as a client may) and the stream action, and its body has neither."""
    if dialect is not Dialect.GEMINI:
        return PATHS[dialect], request
    action = "streamGenerateContent?alt=sse" if request.get("stream") else "generateContent"
    path = f"/v1beta/models/{quote(request['model'], safe='')}:{action}"
    return path, {key: value for key, value in request.items() if key not in ("model", "stream")}


def raw_request(dialect: Dialect, request: dict, headers: dict[str, str] | None = None) -> bytes:
    path, payload = wire(dialect, request)
    return chat_request(payload, headers=headers, path=path)


def posts(requests: list[dict], *, dialect: Dialect = Dialect.CHAT, current_cells=None, name: str = "primary"):
    """Each request on its own httpx call; the responses (status, headers, text) and the attempts."""

    async def scenario():
        async with open_worker(name=name, current_cells=current_cells) as worker:
            answers = []
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{worker.port}", timeout=10) as client:
                for request in requests:
                    path, payload = wire(dialect, request)
                    response = await client.post(path, json=payload)
                    answers.append((response.status_code, response.headers, response.text))
            return answers, list(worker.attempts), worker

    return run_trio(scenario)


def test_a_healthy_stream_is_one_complete_attempt_with_a_head_and_a_first_token():
    answers, attempts, _ = posts([body(CELL, tokens=3)])
    assert answers[0][0] == 200
    [attempt] = attempts
    assert (attempt.cell_id, attempt.server, attempt.dialect, attempt.ended, attempt.status) == (
        CELL,
        "primary",
        Dialect.CHAT,
        "complete",
        200,
    )
    assert attempt.head_s is not None and attempt.first_token_s is not None
    assert attempt.first_token_s >= attempt.head_s


def test_an_answer_without_tokens_and_an_error_have_no_first_token():
    _, attempts, _ = posts([body(CELL, tokens=0), body(OTHER, http_error=503)])
    assert [(a.ended, a.status, a.head_s is not None, a.first_token_s) for a in attempts] == [
        ("complete", 200, True, None),
        ("http_error:503", 503, True, None),
    ]


def test_a_non_streaming_body_carries_the_first_token():
    _, [attempt], _ = posts([body(CELL, stream=False, tokens=2)])
    assert attempt.ended == "complete" and attempt.first_token_s is not None


def test_attempts_of_picks_one_cell_from_several_servers_in_order_of_arrival():
    def at(cell, server, arrived_at):
        return Attempt(
            cell_id=cell,
            server=server,
            dialect=Dialect.CHAT,
            arrived_at=arrived_at,
            head_s=None,
            first_token_s=None,
            ended="complete",
            status=200,
        )

    primary = [at(CELL, "primary", 3.0), at(OTHER, "primary", 1.0)]
    spare = [at(CELL, "spare", 2.0)]
    assert [(a.server, a.arrived_at) for a in attempts_of(CELL, primary, spare)] == [("spare", 2.0), ("primary", 3.0)]


def test_the_cell_id_is_the_labs_and_the_workers_own_name_is_none():
    assert request_cell_id(model(CELL, tokens=3)) == CELL
    assert request_cell_id("via-finish-fix/" + model(CELL)) == CELL
    assert request_cell_id(model("finishline-worker", tokens=3)) is None
    assert request_cell_id(None) is None


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_a_stale_cell_gets_a_409_naming_it_is_counted_and_never_served(dialect):
    current = frozenset({CELL})
    answers, attempts, worker = posts([body(OTHER, dialect), body(CELL, dialect)], dialect=dialect, current_cells=current)
    status, _, text = answers[0]
    assert status == 409
    error = json.loads(text)["error"]
    assert OTHER in error["message"]
    if dialect is Dialect.MESSAGES:
        assert json.loads(text)["type"] == "error" and error["type"] == "invalid_request_error"
    elif dialect is Dialect.GEMINI:
        assert (error["code"], error["status"]) == (409, "ABORTED")
    else:
        assert error["code"] == "stale_cell"
    assert answers[1][0] == 200
    assert [(a.cell_id, a.ended, a.status) for a in attempts] == [(OTHER, "refused_stale", 409), (CELL, "complete", 200)]
    assert worker.stale_refused == 1
    assert [h.status for h in worker.handled] == [409, 200]
    assert worker.arrivals == [model(CELL)]  # the stale one was not served


def test_requests_without_a_cell_id_are_served_whatever_the_current_cells():
    answers, [attempt], worker = posts([body("finishline-worker", tokens=2)], current_cells=frozenset({CELL}))
    assert answers[0][0] == 200 and attempt.cell_id is None and worker.stale_refused == 0


#: OpenAI's error object (Chat, Responses): the four keys its SDKs read (`code` names the error).
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


#: Google's status word per HTTP status the knobs answer with.
GEMINI_STATUSES = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def assert_dialects_error_body(dialect: Dialect, text: str, *, anthropic_type: str, openai_code: str, status: int = 0) -> None:
    """Messages: `{"type": "error", "error": {"type", "message"}}` (Anthropic has no codes); Chat and
    Responses: OpenAI's `{"error": {"message", "type", "param", "code"}}`; Gemini: Google's
    `{"error": {"code": <the status>, "message", "status": <its word>}}`."""
    payload = json.loads(text)
    if dialect is Dialect.GEMINI:
        assert set(payload) == {"error"} and list(payload["error"]) == ["code", "message", "status"]
        assert (payload["error"]["code"], payload["error"]["status"]) == (status, GEMINI_STATUSES[status])
        return
    if dialect is Dialect.MESSAGES:
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
        assert payload["error"]["type"] == anthropic_type
    else:
        assert set(payload) == {"error"} and set(payload["error"]) == OPENAI_ERROR_KEYS
        assert payload["error"]["code"] == openai_code


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_429_with_retry_after_once_then_healthy(dialect):
    answers, attempts, _ = posts([body(CELL, dialect, http_429_retry_after=2)] * 2, dialect=dialect)
    (first_status, first_headers, first_text), (second_status, _, _) = answers
    assert (first_status, first_headers["retry-after"]) == (429, "2")
    assert_dialects_error_body(
        dialect, first_text, anthropic_type="rate_limit_error", openai_code="rate_limit_exceeded", status=429
    )
    assert second_status == 200
    assert [a.ended for a in attempts] == ["http_error:429", "complete"]


def test_once_is_per_cell():
    answers, _, _ = posts([body(CELL, http_500_once=True), body(OTHER, http_500_once=True), body(CELL, http_500_once=True)])
    assert [status for status, _, _ in answers] == [500, 500, 200]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_500_once_then_healthy_in_every_dialect(dialect):
    answers, attempts, _ = posts([body(CELL, dialect, http_500_once=True)] * 2, dialect=dialect)
    assert [status for status, _, _ in answers] == [500, 200]
    assert_dialects_error_body(dialect, answers[0][2], anthropic_type="api_error", openai_code="server_error", status=500)
    assert [(a.ended, a.first_token_s is not None) for a in attempts] == [("http_error:500", False), ("complete", True)]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_400_context_length_on_every_attempt(dialect):
    answers, attempts, _ = posts([body(CELL, dialect, http_400_context_length=True)] * 2, dialect=dialect)
    assert [status for status, _, _ in answers] == [400, 400]
    assert_dialects_error_body(
        dialect, answers[0][2], anthropic_type="invalid_request_error", openai_code="context_length_exceeded", status=400
    )
    if dialect is Dialect.MESSAGES:
        assert "prompt is too long" in json.loads(answers[0][2])["error"]["message"]
    if dialect is Dialect.GEMINI:
        assert "exceeds the maximum number of tokens" in json.loads(answers[0][2])["error"]["message"]
    assert [a.ended for a in attempts] == ["http_error:400", "http_error:400"]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_reset_before_head_once_then_healthy(dialect):
    request = raw_request(dialect, body(CELL, dialect, reset_before_head=True), headers={"connection": "close"})

    async def scenario():
        async with open_worker(name="primary") as worker:
            first = await client_exchange(worker.port, request)
            second = await client_exchange(worker.port, request)
            return first, second, list(worker.attempts)

    first, second, attempts = run_trio(scenario)
    assert (first.data, first.ending) == (b"", "reset")
    assert second.data.startswith(b"HTTP/1.1 200 OK") and second.ending == "fin"
    assert [(a.ended, a.status, a.head_s) for a in attempts][0] == ("reset", None, None)
    assert attempts[1].ended == "complete"


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_no_response_holds_every_attempt_until_the_client_goes(dialect):
    request = raw_request(dialect, body(CELL, dialect, no_response=True))

    async def scenario():
        async with open_worker(name="primary") as worker:
            held = await client_exchange(worker.port, request, stop_after_bytes=0, quiet_seconds=0.3)
            while worker.attempts[0].ended == "in_flight":  # the worker notices the client left
                await trio.sleep(0.01)
            again = await client_exchange(worker.port, request, stop_after_bytes=0, quiet_seconds=0.3)
            return held, again, worker

    held, again, worker = run_trio(scenario)
    assert (held.data, held.ending) == (b"", "open") and (again.data, again.ending) == (b"", "open")
    assert worker.attempts[0].ended == "no_response" and worker.attempts[0].head_s is None
    assert len(worker.attempts) == 2 and worker.handled == [] and worker.attempts[0].dialect is dialect


def test_an_attempt_is_in_flight_while_the_worker_holds_it():
    async def scenario():
        async with open_worker() as worker, trio.open_nursery() as nursery:
            nursery.start_soon(client_exchange, worker.port, chat_request(body(CELL, no_response=True)))
            while not worker.attempts:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
            return worker.attempts[0]

    assert run_trio(scenario).ended == "in_flight"


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_malformed_chunk_is_one_bad_event_mid_stream_in_the_dialects_framing(dialect):
    request = body(CELL, dialect, tokens=4, malformed_chunk=True)
    answers, attempts, _ = posts([request] * 2, dialect=dialect)
    for status, _, text in answers:
        assert status == 200
        end = EVENT_END[dialect]
        events = text.split(end)
        # The dialect's own token event, cut in half: its name (Messages, Responses), then bad JSON.
        name, data = MALFORMED_EVENTS[dialect]
        bad = [e for e in events if e == (f"event: {name}\n" if name else "") + f"data: {data.decode()}"]
        assert len(bad) == 1
        with pytest.raises(ValueError):
            json.loads(data)
        # The rest of the stream is the healthy one, in order, around it.
        healthy = response_plan(WorkerSettings(tokens=4).for_request(request, dialect), dialect=dialect)
        assert [e for e in events if e not in bad] == [s.event.decode().removesuffix(end) for s in healthy.segments] + [""]
        assert events.index(bad[0]) not in (0, len(events) - 2)
    assert [a.ended for a in attempts] == ["complete", "complete"]


def test_openai_python_retries_a_500_and_the_worker_records_both_attempts():
    async def scenario():
        async with open_worker(name="primary") as worker:
            client = openai.OpenAI(base_url=worker.base_url, api_key="lab", max_retries=2)

            def call():
                stream = client.chat.completions.create(
                    model=model(CELL, tokens=3, http_500_once=True), messages=[{"role": "user", "content": "hi"}], stream=True
                )
                return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

            text = await trio.to_thread.run_sync(call)
            return text, attempts_of(CELL, worker)

    text, attempts = run_trio(scenario)
    assert text == "The quick brown"
    assert [(a.server, a.ended, a.status) for a in attempts] == [("primary", "http_error:500", 500), ("primary", "complete", 200)]
    assert attempts[0].first_token_s is None and attempts[1].first_token_s is not None


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_slow_first_token_sends_the_head_at_once_and_holds_the_first_event(dialect):
    request = body(CELL, dialect, tokens=2, prefill_delay=30)
    plan = response_plan(WorkerSettings(tokens=2, prefill_delay=30).for_request(request, dialect), dialect=dialect)

    async def scenario():
        async with open_worker() as worker:
            raw = raw_request(dialect, request)
            # Only "nothing more came for a while" is concluded from time: the head, then silence.
            return await client_exchange(worker.port, raw, stop_after_bytes=plan.head_length, quiet_seconds=0.5)

    received = run_trio(scenario)
    assert (received.data, received.ending) == (plan.to_bytes()[: plan.head_length], "open")


# -- what each dialect's SDK makes of the worker's error bodies -----------------------------------


@pytest.mark.parametrize(
    ("settings", "error_class", "error_type"),
    [
        ({"http_429_retry_after": 2}, anthropic.RateLimitError, "rate_limit_error"),
        ({"http_500_once": True}, anthropic.InternalServerError, "api_error"),
        ({"http_400_context_length": True}, anthropic.BadRequestError, "invalid_request_error"),
    ],
)
def test_anthropic_python_classifies_the_messages_error_bodies(settings, error_class, error_type):
    async def scenario():
        async with open_worker() as worker:
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{worker.port}", api_key="lab", max_retries=0)

            def call():
                with pytest.raises(anthropic.APIStatusError) as raised:
                    client.messages.create(
                        model=model(CELL, **settings), max_tokens=100, messages=[{"role": "user", "content": "hi"}], stream=True
                    )
                return raised.value

            return await trio.to_thread.run_sync(call)

    error = run_trio(scenario)
    assert type(error) is error_class
    assert error.body["error"]["type"] == error_type  # the SDK keeps the whole body: `{"type": "error", "error": {...}}`


@pytest.mark.parametrize(
    ("settings", "error_class", "code"),
    [
        ({"http_429_retry_after": 2}, openai.RateLimitError, "rate_limit_exceeded"),
        ({"http_500_once": True}, openai.InternalServerError, "server_error"),
        ({"http_400_context_length": True}, openai.BadRequestError, "context_length_exceeded"),
    ],
)
def test_openai_python_classifies_the_responses_error_bodies(settings, error_class, code):
    async def scenario():
        async with open_worker() as worker:
            client = openai.OpenAI(base_url=worker.base_url, api_key="lab", max_retries=0)

            def call():
                with pytest.raises(openai.APIStatusError) as raised:
                    client.responses.create(model=model(CELL, **settings), input="hi", stream=True)
                return raised.value

            return await trio.to_thread.run_sync(call)

    error = run_trio(scenario)
    # openai-python reads `error.code` and `error.param` off the body's `error` object.
    assert type(error) is error_class and error.code == code
