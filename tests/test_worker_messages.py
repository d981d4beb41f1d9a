"""The worker in Anthropic Messages: the grammar, what each knob does, and anthropic-python reading it."""

from __future__ import annotations

import json

import anthropic
import pytest
import trio

from finishline import Dialect, EventFramer
from labs.worker import WorkerSettings, open_worker, response_plan
from labs.worker.settings import Finish
from tests.dialect_streams import token_texts_of
from tests.fixtures_lab import run_trio, split_response

MESSAGES = Dialect.MESSAGES


def plan_for(stream: bool = True, **knobs):
    return response_plan(WorkerSettings(**knobs).for_request({"model": "m"}, MESSAGES), stream=stream, dialect=MESSAGES)


def frames_of(plan) -> list[tuple[str | None, dict]]:
    """(SSE event name, data) of each event, framed by the core's EventFramer."""
    events = EventFramer().receive_data(split_response(plan.to_bytes())[1])
    return [(e.event_type.decode() if e.event_type else None, json.loads(e.data or b"")) for e in events]


def types_of(plan) -> list[str]:
    return [data["type"] for _, data in frames_of(plan)]


# -- the grammar ----------------------------------------------------------------------------------


def test_a_healthy_stream_follows_the_grammar_and_names_every_event():
    frames = frames_of(plan_for(tokens=3))
    assert [name for name, _ in frames] == [data["type"] for _, data in frames]
    assert [data["type"] for _, data in frames] == [
        "message_start", "ping", "content_block_start",
        "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    start = frames[0][1]["message"]
    assert (start["id"], start["role"], start["content"], start["stop_reason"]) == ("msg_finishline", "assistant", [], None)
    assert start["usage"] == {"input_tokens": 12, "output_tokens": 0}
    assert frames[-2][1] == {
        "type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 3},
    }  # fmt: skip


def test_reasoning_is_a_thinking_block_closed_by_a_signature():
    frames = [data for _, data in frames_of(plan_for(tokens=1, reasoning_tokens=2))]
    assert frames[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [f["delta"]["type"] for f in frames[3:6]] == ["thinking_delta", "thinking_delta", "signature_delta"]
    assert frames[6] == {"type": "content_block_stop", "index": 0}
    assert frames[7]["content_block"] == {"type": "text", "text": ""} and frames[7]["index"] == 1


def test_a_tool_call_is_a_tool_use_block_with_streamed_input():
    frames = [data for _, data in frames_of(plan_for(tokens=0, tool_calls=1))]
    assert frames[2]["content_block"] == {"type": "tool_use", "id": "call_0_0", "name": "get_weather", "input": {}}
    partial = "".join(f["delta"]["partial_json"] for f in frames if f["type"] == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris", "unit": "celsius"}
    assert frames[-2]["delta"]["stop_reason"] == "tool_use"


def test_max_tokens_cuts_with_stop_reason_max_tokens():
    plan = plan_for(tokens=10, max_tokens=4)
    assert token_texts_of(MESSAGES, split_response(plan.to_bytes())[1]) == ["The", " quick", " brown", " fox"]
    assert frames_of(plan)[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_hide_limit_says_end_turn_where_max_tokens_cut_it():
    plan = plan_for(tokens=10, max_tokens=4, hide_limit=True)
    assert token_texts_of(MESSAGES, split_response(plan.to_bytes())[1]) == ["The", " quick", " brown", " fox"]
    assert frames_of(plan)[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert frames_of(plan)[-2][1]["usage"]["output_tokens"] == 4
    assert plan.answer.choices[0].finish_reason == "length"


def test_the_request_reads_max_tokens_and_a_forced_tool_choice():
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        body = {"model": "m", "max_tokens": 3, "tools": tools, "tool_choice": choice}
        settings = WorkerSettings(tokens=1).for_request(body, MESSAGES)
        assert (settings.max_tokens, settings.tool_calls) == (3, 1)
    auto = WorkerSettings().for_request({"model": "m", "tools": tools, "tool_choice": {"type": "auto"}}, MESSAGES)
    assert auto.tool_calls == 0


def test_n_means_one_choice():
    assert plan_for(tokens=3, n=3).to_bytes() == plan_for(tokens=3).to_bytes()
    unresolved = response_plan(WorkerSettings(tokens=3, n=3), dialect=MESSAGES)
    assert len(unresolved.answer.choices) == 1 and unresolved.token_events == 3


# -- the knobs ------------------------------------------------------------------------------------


def test_finish_omitted_sends_no_message_delta_but_message_stop():
    assert types_of(plan_for(tokens=2, finish=Finish.OMITTED))[-2:] == ["content_block_stop", "message_stop"]


def test_finish_empty_sends_an_empty_stop_reason():
    assert frames_of(plan_for(tokens=2, finish=Finish.EMPTY))[-2][1]["delta"]["stop_reason"] == ""


def test_null_reason_sends_stop_reason_null_then_message_stop_like_vllm():
    frames = frames_of(plan_for(tokens=2, null_reason=True))
    assert frames[-2][1]["delta"] == {"stop_reason": None, "stop_sequence": None}
    assert frames[-1][1] == {"type": "message_stop"}


def test_done_0_loses_message_stop_only():
    frames = frames_of(plan_for(tokens=2, done=False))
    assert frames[-1][1]["type"] == "message_delta" and frames[-1][1]["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize(
    ("status", "kind"), [(429, "rate_limit_error"), (529, "overloaded_error"), (500, "api_error"), (503, "api_error")]
)
def test_error_after_sends_an_error_event_and_nothing_after_it(status, kind):
    plan = plan_for(tokens=10, error_after=4, error_status=status)
    frames = frames_of(plan)
    assert token_texts_of(MESSAGES, split_response(plan.to_bytes())[1]) == ["The", " quick", " brown", " fox"]
    assert frames[-1][0] == "error" and frames[-1][1]["type"] == "error"
    assert frames[-1][1]["error"]["type"] == kind
    assert "message_stop" not in types_of(plan) and "message_delta" not in types_of(plan)


def test_bare_error_is_a_data_frame_without_an_event_name():
    frames = frames_of(plan_for(tokens=10, error_after=2, bare_error=True))
    assert frames[-1][0] is None
    assert frames[-1][1]["error"]["code"] == "rate_limit_exceeded"


def test_close_after_reasoning_ends_right_after_the_last_thinking_delta():
    frames = frames_of(plan_for(tokens=5, reasoning_tokens=2, close_after_reasoning=True))
    assert frames[-1][1]["delta"] == {"type": "thinking_delta", "thinking": " me"}
    assert plan_for(tokens=5, reasoning_tokens=2, close_after_reasoning=True).answer.choices[0].content == ""


def test_include_usage_changes_nothing_in_the_body():
    def body(**knobs):
        return split_response(plan_for(tokens=3, **knobs).to_bytes())[1]

    assert body(include_usage=True) == body(include_usage=False)


def test_prompt_tokens_and_model_are_echoed():
    settings = WorkerSettings(tokens=1, prompt_tokens=40, model="claude-x").for_request({"model": "m"}, MESSAGES)
    start = frames_of(response_plan(settings, dialect=MESSAGES))[0][1]["message"]
    assert (start["model"], start["usage"]["input_tokens"]) == ("claude-x", 40)


@pytest.mark.parametrize(
    ("status", "kind"), [(429, "rate_limit_error"), (529, "overloaded_error"), (400, "invalid_request_error")]
)
def test_http_error_has_anthropics_error_body(status, kind):
    head, body = split_response(plan_for(http_error=status).to_bytes())
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert json.loads(body)["type"] == "error" and json.loads(body)["error"]["type"] == kind


@pytest.mark.parametrize(("knobs", "reason"), [({}, "end_turn"), ({"finish": "empty"}, ""), ({"null_reason": True}, None)])
def test_non_streaming_message_carries_the_same_answer(knobs, reason):
    message = json.loads(split_response(plan_for(False, tokens=2, reasoning_tokens=1, tool_calls=1, **knobs).to_bytes())[1])
    assert [block["type"] for block in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][2]["input"] == {"city": "Paris", "unit": "celsius"}
    assert message["stop_reason"] == ("tool_use" if reason == "end_turn" else reason)
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 9}


# -- anthropic-python -----------------------------------------------------------------------------


def with_anthropic(function, defaults: WorkerSettings | None = None):
    """Run a blocking anthropic-python call against a worker served by trio in this thread."""

    async def scenario():
        async with open_worker(defaults) as worker:
            # anthropic-python appends /v1/messages to its base URL itself.
            client = anthropic.Anthropic(
                base_url=f"http://{worker.host}:{worker.port}", api_key="unused", max_retries=0, timeout=10
            )
            result = await trio.to_thread.run_sync(function, client)
            return result, list(worker.handled)

    return run_trio(scenario)


USER = [{"role": "user", "content": "hi"}]


def test_anthropic_helper_reads_text_thinking_tool_use_and_the_reason():
    def call(client):
        with client.messages.stream(
            model="finishline-worker;tokens=4;reasoning_tokens=2;tool_calls=1", max_tokens=100, messages=USER
        ) as stream:
            message = stream.get_final_message()
        return [
            (b.type, getattr(b, "text", None) or getattr(b, "thinking", None) or b.input) for b in message.content
        ], message.stop_reason

    (blocks, reason), handled = with_anthropic(call)
    assert blocks == [("thinking", "Let me"), ("text", "The quick brown fox"), ("tool_use", {"city": "Paris", "unit": "celsius"})]
    assert reason == "tool_use"
    assert (handled[0].path, handled[0].dialect, handled[0].stream) == ("/v1/messages", MESSAGES, True)


def test_anthropic_raw_stream_reads_the_text_and_the_reason():
    def call(client):
        events = list(client.messages.create(model="m;tokens=3", max_tokens=100, messages=USER, stream=True))
        text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
        return text, [e.delta.stop_reason for e in events if e.type == "message_delta"], events[-1].type

    assert with_anthropic(call)[0] == ("The quick brown", ["end_turn"], "message_stop")


def test_anthropic_forced_tool_and_max_tokens_from_the_request():
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]

    def call(client):
        forced = client.messages.create(
            model="m;tokens=1", max_tokens=100, messages=USER, tools=tools, tool_choice={"type": "any"}
        )
        with client.messages.stream(model="m;tokens=10", max_tokens=2, messages=USER) as stream:
            cut = stream.get_final_message()
        return forced.stop_reason, forced.content[-1].name, cut.stop_reason, cut.content[0].text

    assert with_anthropic(call)[0] == ("tool_use", "get_weather", "max_tokens", "The quick")


def test_anthropic_raises_on_the_error_event_and_on_http_errors():
    def call(client):
        with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
            list(
                client.messages.create(
                    model="m;tokens=5;error_after=2;error_status=529", max_tokens=100, messages=USER, stream=True
                )
            )
        with pytest.raises(anthropic.RateLimitError, match="Rate limit reached"):
            client.messages.create(model="m;http_error=429", max_tokens=100, messages=USER, stream=True)
        return True

    assert with_anthropic(call)[0]


def test_anthropic_helper_is_silent_on_the_defects_the_knobs_make():
    # dialects.md section 1, columns A and B: these are what finish_fix must repair.
    def call(client):
        reasons = []
        for knobs in ("null_reason=1", "finish=omitted", "done=0;finish=omitted", "error_after=2;bare_error=1"):
            with client.messages.stream(model=f"m;tokens=3;{knobs}", max_tokens=100, messages=USER) as stream:
                reasons.append(stream.get_final_message().stop_reason)
        return reasons

    assert with_anthropic(call)[0] == [None, None, None, None]


def test_count_tokens_is_no_completion_route():
    def call(client):
        with pytest.raises(anthropic.NotFoundError):
            client.messages.count_tokens(model="m", messages=USER)
        return True

    result, handled = with_anthropic(call)
    assert result and handled[0].dialect is None
