"""The worker in OpenAI Responses: the grammar, what each knob does, and openai-python reading it."""

from __future__ import annotations

import json

import openai
import pytest
import trio

from finishline import Dialect, EventFramer
from labs.worker import WorkerSettings, open_worker, response_plan
from labs.worker.settings import Finish
from tests.dialect_streams import token_texts_of
from tests.fixtures_lab import run_trio, split_response

RESPONSES = Dialect.RESPONSES


def plan_for(stream: bool = True, **knobs):
    settings = WorkerSettings(**knobs).for_request({"model": "m"}, RESPONSES)
    return response_plan(settings, stream=stream, dialect=RESPONSES)


def frames_of(plan) -> list[tuple[str | None, dict | str]]:
    """(SSE event name, data) of each event, framed by the core's EventFramer; `[DONE]` as is."""
    events = EventFramer().receive_data(split_response(plan.to_bytes())[1])
    return [
        (e.event_type.decode() if e.event_type else None, "[DONE]" if e.data == b"[DONE]" else json.loads(e.data or b""))
        for e in events
    ]


def types_of(plan) -> list[str]:
    return [data["type"] if isinstance(data, dict) else data for _, data in frames_of(plan)]


# -- the grammar ----------------------------------------------------------------------------------


def test_a_healthy_stream_follows_the_grammar_numbers_and_names_every_event():
    frames = frames_of(plan_for(tokens=2))
    assert [name for name, _ in frames] == [data["type"] for _, data in frames]
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert [data["type"] for _, data in frames] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    lifecycle = [data["response"] for _, data in frames if "response" in data]
    assert {r["id"] for r in lifecycle} == {"resp_finishline"}
    final = lifecycle[-1]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "The quick"
    assert final["usage"]["output_tokens"] == 2 and final["usage"]["input_tokens"] == 12


def test_reasoning_and_function_call_items():
    frames = [data for _, data in frames_of(plan_for(tokens=1, reasoning_tokens=2, tool_calls=1))]
    added = [f["item"] for f in frames if f["type"] == "response.output_item.added"]
    assert [(i["type"], i["id"]) for i in added] == [
        ("reasoning", "rs_finishline_0"), ("message", "msg_finishline_1"), ("function_call", "fc_finishline_2"),
    ]  # fmt: skip
    assert (added[2]["call_id"], added[2]["name"]) == ("call_0_0", "get_weather")
    summary = [f["delta"] for f in frames if f["type"] == "response.reasoning_summary_text.delta"]
    arguments = [f["delta"] for f in frames if f["type"] == "response.function_call_arguments.delta"]
    assert "".join(summary) == "Let me" and json.loads("".join(arguments)) == {"city": "Paris", "unit": "celsius"}
    assert frames[-1]["type"] == "response.completed" and frames[-1]["response"]["usage"]["output_tokens_details"] == {
        "reasoning_tokens": 2
    }


def test_max_tokens_ends_with_response_incomplete():
    plan = plan_for(tokens=10, max_tokens=3)
    final = frames_of(plan)[-1][1]
    assert final["type"] == "response.incomplete"
    assert (final["response"]["status"], final["response"]["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert final["response"]["output"][0]["status"] == "incomplete"
    assert token_texts_of(RESPONSES, split_response(plan.to_bytes())[1]) == ["The", " quick", " brown"]


def test_hide_limit_ends_a_truncated_stream_completed_like_llama_cpp():
    plan = plan_for(tokens=6, max_tokens=4, hide_limit=True)
    name, terminal = frames_of(plan)[-1]
    assert name == "response.completed" and isinstance(terminal, dict)
    assert terminal["response"]["status"] == "completed" and terminal["response"]["incomplete_details"] is None
    assert terminal["response"]["usage"]["output_tokens"] == 4
    assert plan.answer.choices[0].finish_reason == "length"  # the truth stays the expected answer's
    whole = json.loads(split_response(plan_for(stream=False, tokens=6, max_tokens=4, hide_limit=True).to_bytes())[1])
    assert (whole["status"], whole["incomplete_details"]) == ("completed", None)
    # Without a truncation there is nothing to hide.
    assert frames_of(plan_for(tokens=3, hide_limit=True)) == frames_of(plan_for(tokens=3))


def test_responses_indexes_0_leaves_every_index_out_like_llama_cpp():
    with_indexes = frames_of(plan_for(tokens=3, reasoning_tokens=1, tool_calls=1))
    without = frames_of(plan_for(tokens=3, reasoning_tokens=1, tool_calls=1, responses_indexes=False))
    indexes = ("sequence_number", "output_index", "content_index")
    assert all(not set(indexes) & set(data) for _, data in without if isinstance(data, dict))
    stripped = [
        (name, {k: v for k, v in data.items() if k not in indexes}) for name, data in with_indexes if isinstance(data, dict)
    ]
    assert without == stripped


def test_the_request_reads_max_output_tokens_and_a_forced_tool_choice():
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        body = {"model": "m", "max_output_tokens": 5, "tools": tools, "tool_choice": choice, "max_tokens": 1}
        settings = WorkerSettings(tokens=1).for_request(body, RESPONSES)
        assert (settings.max_tokens, settings.tool_calls) == (5, 1)


# -- the knobs ------------------------------------------------------------------------------------


def test_done_0_loses_the_terminal_event():
    assert types_of(plan_for(tokens=2, done=False))[-1] == "response.output_item.done"


def test_finish_omitted_ends_with_done_marker_instead_of_a_terminal():
    assert types_of(plan_for(tokens=2, finish=Finish.OMITTED))[-2:] == ["response.output_item.done", "[DONE]"]
    assert types_of(plan_for(tokens=2, finish=Finish.OMITTED, done=False))[-1] == "response.output_item.done"


@pytest.mark.parametrize(("knobs", "status"), [({"finish": Finish.EMPTY}, ""), ({"null_reason": True}, None)])
def test_empty_and_null_reasons_are_the_terminal_status(knobs, status):
    final = frames_of(plan_for(tokens=2, **knobs))[-1][1]
    assert (final["type"], final["response"]["status"]) == ("response.completed", status)


@pytest.mark.parametrize(("status", "code"), [(429, "rate_limit_exceeded"), (500, "server_error")])
def test_error_after_sends_a_nested_error_then_response_failed(status, code):
    plan = plan_for(tokens=10, error_after=4, error_status=status)
    frames = [data for _, data in frames_of(plan)]
    assert token_texts_of(RESPONSES, split_response(plan.to_bytes())[1]) == ["The", " quick", " brown", " fox"]
    assert frames[-2]["type"] == "error" and frames[-2]["error"]["code"] == code
    assert frames[-1]["type"] == "response.failed"
    assert (frames[-1]["response"]["status"], frames[-1]["response"]["error"]["code"]) == ("failed", code)
    assert frames[-1]["response"]["id"] == frames[0]["response"]["id"]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    assert types_of(plan_for(tokens=10, error_after=4, done=False))[-1] == "error"


def test_bare_error_is_a_data_frame_and_nothing_after_it_like_vllm():
    frames = frames_of(plan_for(tokens=10, error_after=2, bare_error=True))
    name, data = frames[-1]
    assert name is None and set(data) == {"error"} and data["error"]["code"] == "rate_limit_exceeded"
    assert frames[-2][1]["type"] == "response.output_text.delta"  # then the frame, and nothing else


def test_close_after_reasoning_ends_right_after_a_reasoning_delta_like_ollama():
    assert (
        types_of(plan_for(tokens=5, reasoning_tokens=2, close_after_reasoning=True))[-1]
        == "response.reasoning_summary_text.delta"
    )


def test_include_usage_changes_nothing_in_the_body():
    def body(**knobs):
        return split_response(plan_for(tokens=3, **knobs).to_bytes())[1]

    assert body(include_usage=True) == body(include_usage=False)


def test_http_error_has_openais_error_body():
    head, body = split_response(plan_for(http_error=429).to_bytes())
    assert head.startswith("HTTP/1.1 429 ") and json.loads(body)["error"]["code"] == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("knobs", "status"), [({}, "completed"), ({"max_tokens": 2}, "incomplete"), ({"error_after": 1}, "failed")]
)
def test_non_streaming_response_carries_the_same_answer(knobs, status):
    response = json.loads(split_response(plan_for(False, tokens=3, **knobs).to_bytes())[1])
    assert response["object"] == "response" and response["status"] == status
    text = response["output"][0]["content"][0]["text"]
    assert text == {"completed": "The quick brown", "incomplete": "The quick", "failed": "The"}[status]


# -- openai-python --------------------------------------------------------------------------------


def with_openai(function):
    """Run a blocking openai-python call against a worker served by trio in this thread."""

    async def scenario():
        async with open_worker() as worker:
            client = openai.OpenAI(base_url=worker.base_url, api_key="unused", max_retries=0, timeout=10)
            result = await trio.to_thread.run_sync(function, client)
            return result, list(worker.handled), list(worker.arrivals)

    return run_trio(scenario)


def test_openai_helper_reads_text_reasoning_function_call_and_status():
    def call(client):
        with client.responses.stream(model="finishline-worker;tokens=4;reasoning_tokens=2;tool_calls=1", input="hi") as stream:
            response = stream.get_final_response()
        reasoning = response.output[0].summary[0].text
        call_item = response.output[2]
        return response.output_text, reasoning, (call_item.name, call_item.arguments), response.status

    result, handled, arrivals = with_openai(call)
    assert result == ("The quick brown fox", "Let me", ("get_weather", '{"city": "Paris", "unit": "celsius"}'), "completed")
    assert (handled[0].path, handled[0].dialect) == ("/v1/responses", RESPONSES)
    assert arrivals == ["finishline-worker;tokens=4;reasoning_tokens=2;tool_calls=1"]


def test_openai_raw_stream_reads_the_text_and_the_terminal():
    def call(client):
        events = list(client.responses.create(model="m;tokens=3", input="hi", stream=True))
        return "".join(e.delta for e in events if e.type == "response.output_text.delta"), events[-1].type

    assert with_openai(call)[0] == ("The quick brown", "response.completed")


def test_openai_forced_tool_and_max_output_tokens_from_the_request():
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]

    def call(client):
        forced = client.responses.create(model="m;tokens=1", input="hi", tools=tools, tool_choice="required")
        cut = list(client.responses.create(model="m;tokens=10", input="hi", max_output_tokens=2, stream=True))[-1]
        return forced.output[-1].type, cut.type, cut.response.incomplete_details.reason

    assert with_openai(call)[0] == ("function_call", "response.incomplete", "max_output_tokens")


def test_openai_helper_raises_without_response_completed():
    # dialects.md section 2: get_final_response needs `response.completed`; the raw stream ends silently.
    def call(client):
        for knobs in ("done=0", "finish=omitted", "close_after_reasoning=1;reasoning_tokens=2", "max_tokens=2"):
            with pytest.raises(RuntimeError, match="response.completed"):
                with client.responses.stream(model=f"m;tokens=3;{knobs}", input="hi") as stream:
                    stream.get_final_response()
        silent = list(client.responses.create(model="m;tokens=3;done=0", input="hi", stream=True))
        return silent[-1].type

    assert with_openai(call)[0] == "response.output_item.done"


def test_openai_raises_on_the_nested_error_event_and_on_http_errors():
    def call(client):
        with pytest.raises(openai.APIError, match="Rate limit reached"):
            list(client.responses.create(model="m;tokens=5;error_after=2", input="hi", stream=True))
        with pytest.raises(openai.RateLimitError):
            client.responses.create(model="m;http_error=429", input="hi", stream=True)
        return True

    assert with_openai(call)[0]
