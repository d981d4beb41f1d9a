"""The worker in Google Gemini: the chunks, what each knob does, both stream forms, finish_fix's
Gemini rules reading it as healthy, and google-genai reading it."""

from __future__ import annotations

import json

import pytest
import trio
from google import genai
from google.genai import errors, types

from finishline import Dialect, EventFramer, RequestFacts
from labs.worker import WorkerSettings, open_worker, response_plan
from labs.worker.request_reading import gemini_json_array, gemini_request_body
from labs.worker.server import completion_dialect
from labs.worker.settings import Finish, SettingsError
from tests.feeding import CHUNKINGS, run, split
from tests.fixtures_lab import run_trio, split_response

GEMINI = Dialect.GEMINI


def plan_for(stream: bool = True, *, json_array: bool = False, body: dict | None = None, **knobs):
    settings = WorkerSettings(**knobs).for_request({"model": "m", **(body or {})}, GEMINI)
    return response_plan(settings, stream=stream, dialect=GEMINI, json_array=json_array)


def chunks_of(plan, chunking: str = "whole") -> list:
    """Each SSE frame's data, parsed (a piece that is not JSON kept as its bytes), framed by the
    core's EventFramer fed `chunking`-wise; the JSON-array form's elements, parsed as one array (or,
    ended by an error element as Google's close leaves it, closed first)."""
    body = split_response(plan.to_bytes())[1].decode()
    if body.startswith("["):
        return json.loads(body if body.endswith("]") else body + "]")
    framer = EventFramer()
    events = [event for piece in split(body.encode(), chunking) for event in framer.receive_data(piece)]
    parsed: list = []
    for event in events:
        if event.data is None:
            continue
        try:
            parsed.append(json.loads(event.data))
        except ValueError:
            parsed.append(event.data)
    return parsed


def texts(chunks: list[dict]) -> str:
    return "".join(part.get("text", "") for c in chunks for part in c["candidates"][0]["content"]["parts"])


def reasons(chunks: list[dict]) -> list:
    return [c["candidates"][0]["finishReason"] for c in chunks if "finishReason" in c["candidates"][0]]


# -- the chunks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_a_healthy_stream_is_text_chunks_then_the_reason_with_usage_and_ids_on_every_chunk(chunking):
    plan = plan_for(tokens=3)
    head, raw = split_response(plan.to_bytes())
    body = raw.decode()
    assert "content-type: text/event-stream" in head
    assert body.startswith("data: {") and body.endswith("}\r\n\r\n") and "event:" not in body and "[DONE]" not in body
    chunks = chunks_of(plan, chunking)
    assert texts(chunks) == "The quick brown" and reasons(chunks) == ["STOP"]
    assert [c["usageMetadata"]["candidatesTokenCount"] for c in chunks] == [1, 2, 3, 3]
    assert {(c["modelVersion"], c["responseId"]) for c in chunks} == {("m", "finishline")}
    assert [s.kind for s in plan.segments] == ["token", "token", "token", "finish"]
    assert plan.offset_after_tokens(3) == plan.head_length + sum(plan.framed_lengths[:3])


def test_thoughts_and_a_whole_function_call_part():
    chunks = chunks_of(plan_for(tokens=1, reasoning_tokens=2, tool_calls=1))
    parts = [c["candidates"][0]["content"]["parts"][0] for c in chunks]
    assert parts[:2] == [{"text": "Let", "thought": True}, {"text": " me", "thought": True}]
    assert parts[3] == {"functionCall": {"name": "get_weather", "args": {"city": "Paris", "unit": "celsius"}}}
    # A call finishes STOP (Gemini has no tool-calls reason); usage counts the call's token events.
    assert reasons(chunks) == ["STOP"]
    assert chunks[-1]["usageMetadata"] == {
        "promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 21, "thoughtsTokenCount": 2,
    }  # fmt: skip


def test_max_output_tokens_from_the_request_caps_and_finishes_max_tokens_and_hide_limit_says_stop():
    capped = chunks_of(plan_for(tokens=10, body={"generationConfig": {"maxOutputTokens": 2}}))
    assert (texts(capped), reasons(capped)) == ("The quick", ["MAX_TOKENS"])
    hidden = chunks_of(plan_for(tokens=10, max_tokens=2, hide_limit=True))
    assert reasons(hidden) == ["STOP"]


def test_a_forcing_function_calling_mode_gets_a_call():
    body = {
        "tools": [{"functionDeclarations": [{"name": "get_weather"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
    }
    chunks = chunks_of(plan_for(tokens=1, body=body))
    assert "functionCall" in chunks[-2]["candidates"][0]["content"]["parts"][0]


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [({"finish": Finish.OMITTED}, []), ({"finish": Finish.EMPTY}, [""]), ({"null_reason": True}, [None])],
)
def test_the_reason_defects(knobs, expected):
    chunks = chunks_of(plan_for(tokens=2, **knobs))
    assert texts(chunks) == "The quick" and reasons(chunks) == expected
    if not expected:  # omitted: no `finishReason` key anywhere
        assert b'"finishReason"' not in split_response(plan_for(tokens=2, **knobs).to_bytes())[1]


def test_an_error_frame_mid_stream_has_error_first_and_nothing_after_it():
    plan = plan_for(tokens=5, error_after=2, error_status=503)
    body = split_response(plan.to_bytes())[1].decode()
    last = body.split("\r\n\r\n")[-2]
    assert last.startswith('data: {"error":')
    error = json.loads(last.removeprefix("data: "))
    assert error == {"error": {"code": 503, "message": error["error"]["message"], "status": "UNAVAILABLE"}}
    assert [s.kind for s in plan.segments] == ["token", "token", "error"]


@pytest.mark.parametrize(("status", "word"), [(429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"), (503, "UNAVAILABLE")])
def test_http_errors_are_gemini_error_bodies(status, word):
    head, body = split_response(plan_for(http_error=status).to_bytes())
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert json.loads(body) == {"error": {"code": status, "message": json.loads(body)["error"]["message"], "status": word}}


def test_a_malformed_chunk_is_half_a_token_chunk_in_a_bare_data_frame():
    plan = plan_for(tokens=4, malformed_chunk=True)
    chunks = chunks_of(plan)
    assert chunks[2] == b'{"candidates":[{"content":{"parts":[{"text":'
    assert [s.kind for s in plan.segments].count("malformed") == 1 and reasons(chunks[3:]) == ["STOP"]


@pytest.mark.parametrize(("knob", "words"), [("done", "done=0"), ("responses_indexes", "responses_indexes=0")])
def test_knobs_without_meaning_in_gemini_are_refused(knob, words):
    with pytest.raises(SettingsError, match=f"^{words} has no meaning in Gemini"):
        WorkerSettings(**{knob: False}).for_request({}, GEMINI)


def test_the_whole_body_carries_the_same_answer():
    body = json.loads(split_response(plan_for(False, tokens=3, reasoning_tokens=1).to_bytes())[1])
    candidate = body["candidates"][0]
    assert candidate["content"]["parts"] == [{"text": "Let", "thought": True}, {"text": "The quick brown"}]
    assert candidate["finishReason"] == "STOP" and body["usageMetadata"]["candidatesTokenCount"] == 3
    omitted = json.loads(split_response(plan_for(False, tokens=3, finish=Finish.OMITTED).to_bytes())[1])
    assert "finishReason" not in omitted["candidates"][0]


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("knobs", [{}, {"error_after": 1}], ids=["healthy", "error"])
def test_the_json_array_form_is_one_json_array(chunking, knobs):
    plan = plan_for(tokens=3, json_array=True, **knobs)
    head, raw = split_response(plan.to_bytes())
    body = raw.decode()
    assert "content-type: application/json" in head and body.startswith("[{") and ",\r\n{" in body
    if knobs:  # ends at the error element, as Google's close does
        assert body.endswith("}") and "error" in chunks_of(plan, chunking)[-1]
    else:
        assert json.loads(body) == chunks_of(plan, chunking) and reasons(json.loads(body)) == ["STOP"]


# -- the request ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix",
    ["/v1", "/v1beta", "/v1beta1/projects/P/locations/L/publishers/google", "", "/gemini/v1beta", "/vertex_ai/v1"],
)
def test_every_prefix_is_a_gemini_route_with_the_model_and_stream_from_the_path(prefix):
    target = f"{prefix}/models/m%3Btokens%3D3;finish=omitted:streamGenerateContent?alt=sse"
    assert completion_dialect(target.split("?")[0]) is GEMINI
    read = gemini_request_body(target, {"contents": []})
    assert (read["model"], read["stream"]) == ("m;tokens=3;finish=omitted", True)
    assert not gemini_json_array(target) and gemini_json_array(target.split("?")[0])
    whole = gemini_request_body(f"{prefix}/models/m:generateContent", {})
    assert (whole["model"], whole["stream"]) == ("m", False)


# -- finish_fix's Gemini rules read the worker's streams as healthy --------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("json_array", [False, True], ids=["sse", "array"])
@pytest.mark.parametrize(
    "knobs", [{}, {"reasoning_tokens": 2, "tool_calls": 1}, {"max_tokens": 3}], ids=["text", "tools", "capped"]
)
def test_finish_fix_passes_the_workers_healthy_stream_byte_for_byte(chunking, json_array, knobs):
    body = split_response(plan_for(tokens=4, json_array=json_array, **knobs).to_bytes())[1]
    facts = RequestFacts(stream=True, json_array_stream=json_array)
    out, repair = run(body, chunking, dialect=GEMINI, request=facts)
    assert out == body and repair.report.verdict.value == "clean"


@pytest.mark.parametrize("knobs", [{"finish": Finish.OMITTED}, {"finish": Finish.EMPTY}], ids=["omitted", "empty"])
def test_finish_fix_repairs_the_workers_reason_defects(knobs):
    body = split_response(plan_for(tokens=4, **knobs).to_bytes())[1]
    out, repair = run(body, "whole", dialect=GEMINI, request=RequestFacts(stream=True))
    assert out.startswith(body) and out[len(body) :].startswith(b'data: {"error":')


# -- google-genai ---------------------------------------------------------------------------------


def with_genai(function):
    """Run a blocking google-genai call against a worker served by trio in this thread."""

    async def scenario():
        async with open_worker() as worker:
            options = types.HttpOptions(base_url=f"http://{worker.host}:{worker.port}", timeout=10_000)
            client = genai.Client(api_key="unused", http_options=options)
            result = await trio.to_thread.run_sync(function, client)
            return result, list(worker.handled), list(worker.arrivals)

    return run_trio(scenario)


def test_google_genai_reads_text_thoughts_call_reason_and_usage():
    def call(client):
        chunks = list(client.models.generate_content_stream(model="finishline-worker;tokens=3;tool_calls=1", contents="hi"))
        calls = [p.function_call for c in chunks for p in c.candidates[0].content.parts or [] if p.function_call]
        text = "".join(c.text or "" for c in chunks)
        return (
            text,
            [(f.name, f.args) for f in calls],
            chunks[-1].candidates[0].finish_reason,
            chunks[-1].usage_metadata.candidates_token_count,
        )

    result, handled, arrivals = with_genai(call)
    assert result == ("The quick brown", [("get_weather", {"city": "Paris", "unit": "celsius"})], types.FinishReason.STOP, 9)
    assert handled[0].path == "/v1/models/finishline-worker;tokens=3;tool_calls=1:streamGenerateContent"
    assert handled[0].dialect is GEMINI and arrivals == ["finishline-worker;tokens=3;tool_calls=1"]


def test_google_genai_whole_answer_and_the_cap_from_its_config():
    def call(client):
        config = types.GenerateContentConfig(max_output_tokens=2)
        whole = client.models.generate_content(model="m;tokens=5", contents="hi", config=config)
        return whole.text, whole.candidates[0].finish_reason

    assert with_genai(call)[0] == ("The quick", types.FinishReason.MAX_TOKENS)


def test_google_genai_raises_on_the_error_frame_and_on_http_errors_and_is_silent_without_a_reason():
    def call(client):
        with pytest.raises(errors.ServerError, match="503 UNAVAILABLE"):
            list(client.models.generate_content_stream(model="m;tokens=5;error_after=2;error_status=503", contents="hi"))
        with pytest.raises(errors.ClientError, match="429 RESOURCE_EXHAUSTED"):
            list(client.models.generate_content_stream(model="m;http_error=429", contents="hi"))
        silent = list(client.models.generate_content_stream(model="m;tokens=2;finish=omitted", contents="hi"))
        return "".join(c.text or "" for c in silent), silent[-1].candidates[0].finish_reason

    assert with_genai(call)[0] == ("The quick", None)
