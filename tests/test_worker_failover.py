"""The worker's failover knobs (issue 28, failoverbench S02, S04, S13-S16) over real sockets: what the
primary and the spare answer to each attempt of a cell, in every dialect, each with its own error
bodies; and the lab's requests-per-cell key and the summary of a cell of several requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import trio

from finishline import Dialect
from labs.cell_requests import summarised
from labs.dialects import LAB_DIALECTS
from labs.outcome import ClientReport, Judgement, Outcome
from labs.scenario import ScenarioError, load_scenario, load_scenarios
from labs.worker import SettingsError, WorkerSettings, open_worker
from labs.worker.answer import PREFILL_MESSAGE
from tests.fixtures_lab import run_trio
from tests.test_worker_conduct import CELL, OTHER, PATHS, assert_dialects_error_body, body, model, wire


def posts(requests: list[dict], *, dialect: Dialect = Dialect.CHAT, spare: bool = False):
    """Each request on its own httpx call to a primary (or, `spare`, the spare): the responses
    (status, headers, text) and the attempts."""

    async def scenario():
        async with open_worker(name="spare" if spare else "primary", spare=spare) as worker:
            answers = []
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{worker.port}", timeout=10) as client:
                for request in requests:
                    path, payload = wire(dialect, request)
                    response = await client.post(path, json=payload)
                    answers.append((response.status_code, response.headers, response.text))
            return answers, list(worker.attempts)

    return run_trio(scenario)


def with_conversation(request: dict, dialect: Dialect, messages: list[dict[str, Any]]) -> dict:
    if dialect is Dialect.GEMINI:  # Gemini's `contents`, the assistant's role `model`
        contents = [
            {"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]} for m in messages
        ]
        return {**request, "contents": contents}
    key = "input" if dialect is Dialect.RESPONSES else "messages"
    return {**request, key: messages}


PREFILL = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The quick brown"}]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_429_persistent_fails_every_attempt_at_the_primary_without_retry_after(dialect):
    answers, attempts = posts([body(CELL, dialect, primary_429_persistent=True)] * 3, dialect=dialect)
    assert [status for status, _, _ in answers] == [429, 429, 429]
    assert all("retry-after" not in headers for _, headers, _ in answers)
    assert_dialects_error_body(
        dialect, answers[0][2], anthropic_type="rate_limit_error", openai_code="rate_limit_exceeded", status=429
    )
    assert [a.ended for a in attempts] == ["http_error:429"] * 3


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_503_persistent_fails_every_attempt_at_the_primary(dialect):
    answers, _ = posts([body(CELL, dialect, primary_503_persistent=True)] * 3, dialect=dialect)
    assert [status for status, _, _ in answers] == [503, 503, 503]
    assert_dialects_error_body(dialect, answers[0][2], anthropic_type="api_error", openai_code="server_error", status=503)


@pytest.mark.parametrize(
    "settings", [{"primary_429_persistent": True}, {"primary_503_persistent": True}, {"primary_503_first": 5}]
)
@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_the_spare_answers_every_attempt_whatever_the_primarys_fault(dialect, settings):
    answers, attempts = posts([body(CELL, dialect, tokens=3, **settings)] * 2, dialect=dialect, spare=True)
    assert [status for status, _, _ in answers] == [200, 200]
    assert [(a.server, a.ended) for a in attempts] == [("spare", "complete")] * 2


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_a_flapping_primary_fails_a_cells_first_k_attempts_then_answers(dialect):
    requests = [body(CELL, dialect, tokens=2, primary_503_first=2)] * 4
    requests.insert(1, body(OTHER, dialect, tokens=2, primary_503_first=2))  # its own count
    answers, _ = posts(requests, dialect=dialect)
    assert [status for status, _, _ in answers] == [503, 503, 503, 200, 200]


def test_a_flapping_primary_with_k_0_never_fails():
    answers, _ = posts([body(CELL, tokens=2, primary_503_first=0)])
    assert answers[0][0] == 200


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_content_policy_400_on_every_attempt_at_every_worker(dialect):
    for spare in (False, True):
        answers, attempts = posts([body(CELL, dialect, http_400_content_policy=True)] * 2, dialect=dialect, spare=spare)
        assert [status for status, _, _ in answers] == [400, 400]
        assert_dialects_error_body(
            dialect, answers[0][2], anthropic_type="invalid_request_error", openai_code="content_policy_violation", status=400
        )
        if dialect is Dialect.MESSAGES:
            assert "content filtering policy" in json.loads(answers[0][2])["error"]["message"]
        assert [a.ended for a in attempts] == ["http_error:400"] * 2


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_reject_prefill_answers_400_to_a_conversation_ending_with_the_assistant_and_a_plain_one_normally(dialect):
    plain = body(CELL, dialect, tokens=3, reject_prefill=True)
    prefill = with_conversation(plain, dialect, PREFILL)
    answers, attempts = posts([prefill, plain, prefill], dialect=dialect, spare=True)
    assert [status for status, _, _ in answers] == [400, 200, 400]
    payload = json.loads(answers[0][2])
    assert payload["error"]["message"] == PREFILL_MESSAGE
    if dialect is Dialect.GEMINI:
        assert payload["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert payload["error"]["type"] == "invalid_request_error"
    assert [a.ended for a in attempts] == ["http_error:400", "complete", "http_error:400"]


def test_without_reject_prefill_a_prefill_is_answered():
    answers, _ = posts([with_conversation(body(CELL, tokens=3), Dialect.CHAT, PREFILL)])
    assert answers[0][0] == 200


def test_a_responses_input_string_is_not_a_prefill():
    request = {**body(CELL, Dialect.RESPONSES, tokens=3, reject_prefill=True), "input": "hi"}
    answers, _ = posts([request], dialect=Dialect.RESPONSES)
    assert answers[0][0] == 200


def usage_and_model(dialect: Dialect, text: str) -> tuple[str, int]:
    """The model named and the prompt tokens reported in a stream of `dialect`."""
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    if dialect is Dialect.CHAT:
        [usage] = [e["usage"] for e in events if e.get("usage")]
        return events[0]["model"], usage["prompt_tokens"]
    if dialect is Dialect.MESSAGES:
        [start] = [e for e in events if e["type"] == "message_start"]
        return start["message"]["model"], start["message"]["usage"]["input_tokens"]
    if dialect is Dialect.GEMINI:
        return events[-1]["modelVersion"], events[-1]["usageMetadata"]["promptTokenCount"]
    [done] = [e for e in events if e["type"] == "response.completed"]
    return done["response"]["model"], done["response"]["usage"]["input_tokens"]


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
def test_the_spare_answers_as_its_own_model_with_its_own_usage(dialect):
    settings = {"tokens": 3, "include_usage": True, "spare_model": "finishline-spare", "spare_prompt_tokens": 21}
    request = body(CELL, dialect, **settings)
    [(status, _, spare_text)], _ = posts([request], dialect=dialect, spare=True)
    [(_, _, primary_text)], _ = posts([request], dialect=dialect)
    assert status == 200
    assert usage_and_model(dialect, spare_text) == ("finishline-spare", 21)
    assert usage_and_model(dialect, primary_text) == (request["model"], 12)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http_400_content_policy=1; http_400_context_length=1", "each a 400 with its own body"),
        ("http_400_content_policy=1; http_error=500", "http_400_content_policy is a 400"),
        ("spare_model=a b", "spare_model must be a non-empty name"),
        ("primary_503_first=-1", "primary_503_first must be >= 0"),
        ("spare_prompt_tokens=-2", "spare_prompt_tokens must be >= 0"),
    ],
)
def test_bad_failover_settings_are_refused_with_their_name(text, message):
    from labs.worker.settings import parse_settings

    with pytest.raises(SettingsError, match=message):
        parse_settings(text)


def test_the_failover_knobs_travel_in_the_model_name():
    settings = WorkerSettings(primary_503_first=10, spare_model="finishline-spare", spare_prompt_tokens=21, reject_prefill=True)
    from labs.worker.settings import parse_settings

    assert parse_settings(settings.to_model_name(CELL)) == settings


def test_openai_python_reads_the_content_policy_code():
    async def scenario():
        async with open_worker() as worker:
            client = openai.OpenAI(base_url=worker.base_url, api_key="lab", max_retries=0)

            def call():
                with pytest.raises(openai.APIStatusError) as raised:
                    client.chat.completions.create(
                        model=model(CELL, http_400_content_policy=True), messages=[{"role": "user", "content": "hi"}], stream=True
                    )
                return raised.value

            return await trio.to_thread.run_sync(call)

    error = run_trio(scenario)
    assert type(error) is openai.BadRequestError and error.code == "content_policy_violation"


def test_anthropic_python_raises_bad_request_on_a_prefill_at_a_rejecting_spare():
    async def scenario():
        async with open_worker(name="spare", spare=True) as worker:
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{worker.port}", api_key="lab", max_retries=0)

            def call():
                with pytest.raises(anthropic.APIStatusError) as raised:
                    client.messages.create(model=model(CELL, reject_prefill=True), max_tokens=100, messages=PREFILL, stream=True)
                return raised.value

            return await trio.to_thread.run_sync(call)

    error = run_trio(scenario)
    assert type(error) is anthropic.BadRequestError and error.body["error"]["message"] == PREFILL_MESSAGE


# -- the lab's side: requests per cell -----------------------------------------------------------


def test_the_six_failover_scenarios_load_with_a_spare_and_flapping_sends_20_requests():
    scenarios = {s.name: s for s in load_scenarios()}
    six = (
        "http-429-persistent",
        "http-503-persistent",
        "http-400-content-policy",
        "cut-then-prefill-rejected",
        "flapping-primary",
        "fallback-model-usage",
    )
    assert all(scenarios[name].pool_workers == 2 and not scenarios[name].default for name in six)
    assert scenarios["flapping-primary"].requests_per_cell == 20
    assert {scenarios[name].requests_per_cell for name in six if name != "flapping-primary"} == {1}


@pytest.mark.parametrize("value", ["0", "true", "2.5", '"20"'])
def test_requests_per_cell_must_be_a_positive_whole_number(tmp_path: Path, value):
    path = tmp_path / "x.toml"
    path.write_text(f'title = "x"\nrequests_per_cell = {value}\n')
    with pytest.raises(ScenarioError, match="requests_per_cell"):
        load_scenario(path)


def _sent(*outcomes: Outcome) -> list[tuple[ClientReport, Judgement, float]]:
    return [
        (
            ClientReport(client="c", completed=o is Outcome.OK, error_class=None if o is Outcome.OK else f"E{i}"),
            Judgement(outcome=o, reason=f"why {i}"),
            1.0,
        )
        for i, o in enumerate(outcomes, start=1)
    ]


def test_a_cell_of_several_requests_is_its_loudest_request_with_the_count_of_each_word():
    report, judgement, seconds = summarised(_sent(Outcome.OK, Outcome.ERROR, Outcome.OK, Outcome.ERROR))
    assert judgement.outcome is Outcome.ERROR
    assert judgement.reason == "4 requests: ok 2 / error 2; first error (request 2): why 2"
    assert report.error_class == "E2" and seconds == 4.0


def test_a_cell_of_several_ok_requests_is_ok_with_the_count():
    _, judgement, _ = summarised(_sent(Outcome.OK, Outcome.OK))
    assert (judgement.outcome, judgement.reason) == (Outcome.OK, "2 requests: ok 2")


def test_a_cell_of_one_request_is_that_request():
    sent = _sent(Outcome.HANG)
    assert summarised(sent) == sent[0]


def test_a_standalone_worker_started_as_the_spare_answers_despite_the_primarys_fault():
    from functools import partial

    from labs.worker.__main__ import build_parser
    from labs.worker.server import serve_worker

    assert build_parser().parse_args(["--spare"]).spare is True
    assert build_parser().parse_args([]).spare is False

    async def scenario():
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_worker, WorkerSettings(), spare=True))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                response = await client.post(PATHS[Dialect.CHAT], json=body(CELL, tokens=2, primary_503_persistent=True))
            nursery.cancel_scope.cancel()
            return response.status_code

    assert run_trio(scenario) == 200
