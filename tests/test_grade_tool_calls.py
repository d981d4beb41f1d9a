"""The forced tool call's check in every dialect (`labs.grade.server_checks.tool_call_check`): it
needs the model to call a tool, so a model that wrote text instead (SmolLM2 on llama.cpp: its chat
template has no tools, so it writes prose to the limit) leaves it `not tested`, saying so; a fail is
kept for a protocol fault, a call made and the wrong reason given. The judge reads answers, so these
tests give it answers: each side (streamed, JSON) read by the graders' reader from bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finishline import Dialect, sse_event
from labs.grade.card import Mark
from labs.grade.reading import read_completion, read_stream
from labs.grade.server_check import Readings
from labs.grade.server_suites import SERVER_SUITES
from tests.chat_streams import chat_chunk, chat_stream
from tests.dialect_streams import messages_stream, responses_stream

CHECKS = {
    Dialect.CHAT: "reason-tool-calls",
    Dialect.MESSAGES: "messages-reason-tool-use",
    Dialect.RESPONSES: "responses-reason-tool-call",
}
ARGUMENTS = '{"city": "Paris"}'
PROSE = ["Sure", ", the", " weather", " in", " Paris"]


def grade(dialect: Dialect, stream: list[bytes], completion: dict[str, Any]) -> tuple[Mark, str]:
    """The tool check's mark and evidence for one streamed and one JSON answer to the tool request."""
    suite = SERVER_SUITES[dialect]
    request = next(r for r in suite.requests if r.name == "tool_call")
    body = {"model": "m", **request.fields, "stream": True}
    readings = Readings(
        streams={"tool_call": read_stream(b"".join(stream), request=body, dialect=dialect)},
        completions={"tool_call": read_completion(json.dumps(completion).encode(), request=body, dialect=dialect)},
        requests=suite.requests,
        dialect=dialect,
    )
    row = next(c for c in suite.checks if c.check == CHECKS[dialect]).run(readings)
    return row.mark, row.evidence


# -- Chat ------------------------------------------------------------------------------------------


def chat_call_stream(reason: str) -> list[bytes]:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
    return [
        sse_event(chat_chunk(choices=[{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}])),
        sse_event(chat_chunk(finish_reason=reason)),
        sse_event("[DONE]"),
    ]


def chat_completion(reason: str, *, call: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if call else "".join(PROSE)}
    if call:
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        ]
    return {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
    }


def test_chat_prose_to_the_limit_is_not_tested_and_says_the_model_made_no_call():
    mark, evidence = grade(Dialect.CHAT, chat_stream(PROSE, finish_reason="length"), chat_completion("length"))
    assert (mark, evidence) == (
        Mark.NOT_TESTED,
        'a forced tool call (tool_choice "required", max_tokens=64): the model made no whole tool call (stream: '
        "plain text to the limit (finish_reason length, 26 characters); JSON: plain text to the limit (finish_reason "
        "length, 26 characters)): the check needs a model that calls tools; not a protocol fault",
    )


def test_chat_prose_that_stops_is_not_tested_either():
    mark, evidence = grade(Dialect.CHAT, chat_stream(PROSE, finish_reason="stop"), chat_completion("stop"))
    assert mark is Mark.NOT_TESTED
    assert "stream: plain text (finish_reason stop, 26 characters)" in evidence


def test_chat_a_call_with_the_wrong_reason_fails():
    mark, evidence = grade(Dialect.CHAT, chat_call_stream("stop"), chat_completion("stop", call=True))
    assert (mark, evidence) == (
        Mark.FAIL,
        "stream a forced tool call (tool_choice \"required\", max_tokens=64): a tool call was made, but it ended with 'stop', expected 'tool_calls'",
    )


def test_chat_tool_calls_without_a_call_fails():
    mark, evidence = grade(Dialect.CHAT, chat_stream(PROSE, finish_reason="tool_calls"), chat_completion("tool_calls"))
    assert (mark, evidence) == (
        Mark.FAIL,
        'stream a forced tool call (tool_choice "required", max_tokens=64): finish_reason tool_calls but no tool call',
    )


def test_chat_a_call_cut_at_the_limit_is_not_tested():
    mark, evidence = grade(Dialect.CHAT, chat_call_stream("length"), chat_completion("length", call=True))
    assert mark is Mark.NOT_TESTED
    assert "stream: a call cut at the limit (finish_reason length)" in evidence


def test_chat_a_call_on_one_side_passes_naming_the_other():
    mark, evidence = grade(Dialect.CHAT, chat_call_stream("tool_calls"), chat_completion("length"))
    assert (mark, evidence) == (
        Mark.PASS,
        'a forced tool call (tool_choice "required", max_tokens=64): stream: tool_calls, JSON: no whole call, plain '
        "text to the limit (finish_reason length, 26 characters)",
    )


# -- Messages and Responses --------------------------------------------------------------------------


def message(stop_reason: str, *, call: bool = False) -> dict[str, Any]:
    content = [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}] if call else []
    content = content or [{"type": "text", "text": "".join(PROSE)}]
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": content, "stop_reason": stop_reason}


def response(status: str, *, call: bool = False) -> dict[str, Any]:
    item = (
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ARGUMENTS, "status": "completed"}
        if call
        else {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "".join(PROSE)}]}
    )
    return {"id": "resp_1", "object": "response", "status": status, "output": [item]}


@pytest.mark.parametrize(
    ("dialect", "stream", "completion", "mark", "said"),
    [
        pytest.param(
            Dialect.MESSAGES,
            messages_stream(PROSE, stop_reason="max_tokens"),
            message("max_tokens"),
            Mark.NOT_TESTED,
            "the model made no whole tool call (stream: plain text to the limit (stop_reason max_tokens, 26 characters)",
            id="messages-prose-to-the-limit",
        ),
        pytest.param(
            Dialect.MESSAGES,
            messages_stream([], tool_use=True, stop_reason="end_turn"),
            message("end_turn", call=True),
            Mark.FAIL,
            "a tool call was made, but it ended with 'end_turn', expected 'tool_use'",
            id="messages-call-with-end-turn",
        ),
        pytest.param(
            Dialect.MESSAGES,
            messages_stream([], tool_use=True, stop_reason="tool_use"),
            message("tool_use", call=True),
            Mark.PASS,
            "stream: tool_use, JSON: tool_use",
            id="messages-call",
        ),
        pytest.param(
            Dialect.RESPONSES,
            responses_stream(PROSE),
            response("completed"),
            Mark.NOT_TESTED,
            "the model made no whole tool call (stream: plain text (status completed, 26 characters)",
            id="responses-prose",
        ),
        pytest.param(
            Dialect.RESPONSES,
            responses_stream([], function_call=True),
            response("completed", call=True),
            Mark.PASS,
            "stream: completed, JSON: completed",
            id="responses-call",
        ),
        pytest.param(
            Dialect.RESPONSES,
            responses_stream([], function_call=True, terminal="response.incomplete"),
            response("incomplete", call=True),
            Mark.NOT_TESTED,
            "stream: a call cut at the limit (status incomplete)",
            id="responses-call-cut-at-the-limit",
        ),
    ],
)
def test_messages_and_responses_grade_the_call_alike(dialect, stream, completion, mark, said):
    got, evidence = grade(dialect, stream, completion)
    assert got is mark, evidence
    assert said in evidence
