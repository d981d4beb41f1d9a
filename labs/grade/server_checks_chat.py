"""The Chat Completions suite (`/chat/completions`): its requests, the checks only Chat has (the
`[DONE]` sentinel, `finish_reason` per chunk and per choice, `include_usage`, `n`), and the suite
as it always was, with the judges every dialect shares (labs.grade.server_checks).

See labs.grade.server_checks for the theory of operation: five requests, each streamed and not,
every answer read once, each check testing one thing.
"""

from __future__ import annotations

from typing import Any

from finishline import Dialect
from labs.grade.card import Finding, Mark
from labs.grade.server_checks import (
    TOOL_CALL_TOKENS,
    Readings,
    ServerCheck,
    ServerRequest,
    ServerSuite,
    completion_problem_for,
    json_no_error,
    reason_check,
    stream_json_agree,
    stream_no_error,
    stream_problem_for,
    tool_call_check,
)
from labs.scenario import WORKER_TOOL

__all__ = ["CHAT_SUITE", "REQUESTS", "SERVER_CHECKS"]

#: A prompt whose honest answer is long, so that `max_tokens` really truncates it.
_LONG_PROMPT = "Write the numbers from 1 to 200 in words, separated by commas."
_SHORT_PROMPT = "Say the sentence about the quick brown fox."

REQUESTS = (
    ServerRequest(name="stop", label="a natural stop", fields={"messages": [{"role": "user", "content": _SHORT_PROMPT}]}),
    ServerRequest(
        name="length",
        label="max_tokens=5",
        fields={"messages": [{"role": "user", "content": _LONG_PROMPT}], "max_tokens": 5},
    ),
    ServerRequest(
        name="tool_call",
        label=f'a forced tool call (tool_choice "required", max_tokens={TOOL_CALL_TOKENS})',
        fields={
            "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
            "tools": [WORKER_TOOL],
            "tool_choice": "required",
            "max_tokens": TOOL_CALL_TOKENS,
        },
    ),
    ServerRequest(name="n2", label="n=2", fields={"messages": [{"role": "user", "content": _SHORT_PROMPT}], "n": 2}),
    ServerRequest(
        name="usage",
        label="stream_options.include_usage",
        fields={"messages": [{"role": "user", "content": _SHORT_PROMPT}], "stream_options": {"include_usage": True}},
        stream_only=True,
    ),
)


_stream_problem = stream_problem_for("stream-no-error")
_completion_problem = completion_problem_for("json-no-error")


# -- streaming ----------------------------------------------------------------------------------


def _stream_finish_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if _stream_problem(readings, name, reading):
            continue
        judged += 1
        if not reading.choices:
            return Mark.FAIL, f"stream {readings.label(name)} carried no choice at all"
        for choice in reading.choices.values():
            if choice.finish_reason is None:
                injected = [r for r in reading.report.repairs if "injected finish_reason" in r]
                why = f"; the core: {injected[0]}" if injected else ""
                return (
                    Mark.FAIL,
                    f"stream {readings.label(name)}: choice {choice.index} got no non-empty finish_reason before [DONE]{why}",
                )
    if not judged:
        return Mark.NOT_TESTED, "no stream completed (see stream-no-error)"
    return Mark.PASS, f"every choice of {judged} streams got a non-empty finish_reason"


def _stream_null_not_empty(readings: Readings) -> Finding:
    for name, reading in readings.streams.items():
        for choice in reading.choices.values():
            if "" in choice.reasons_seen:
                count = choice.reasons_seen.count("")
                return (
                    Mark.FAIL,
                    f'stream {readings.label(name)}: choice {choice.index} has "finish_reason": "" on {count} chunks (null is the spec\'s "not yet")',
                )
    return Mark.PASS, 'no chunk says "finish_reason": ""'


def _stream_done_last(readings: Readings) -> Finding:
    for name, reading in readings.streams.items():
        if reading.status != 200:
            continue
        done = reading.done_positions
        if not done:
            return (
                Mark.FAIL,
                f"stream {readings.label(name)} ended without data: [DONE] ({reading.ending}, last event: {reading.last_event})",
            )
        if len(done) > 1 or done[-1] != len(reading.events) - 1:
            return Mark.FAIL, f"stream {readings.label(name)}: {len(reading.events) - 1 - done[0]} events after the first [DONE]"
    return Mark.PASS, "every stream ends with exactly one data: [DONE]"


def _stream_usage_after_finish(readings: Readings) -> Finding:
    reading = readings.streams["usage"]
    problem = _stream_problem(readings, "usage", reading)
    if problem:
        return Mark.NOT_TESTED, problem
    usage = reading.usage_positions
    if not usage:
        return Mark.FAIL, "stream_options.include_usage was set, but no usage-only chunk (choices [] and usage) came"
    reasons = reading.reason_positions()
    late = [p for p in reasons if p > usage[0]]
    if late:
        return (
            Mark.FAIL,
            f"a finish_reason came in event {late[0] + 1}, after the usage chunk (event {usage[0] + 1}); OpenAI sends the finish chunk first",
        )
    tokens = reading.events[usage[0]][1]["usage"]
    return Mark.PASS, f"the usage chunk ({_usage_words(tokens)}) follows every finish chunk"


def _usage_words(usage: dict[str, Any]) -> str:
    return ", ".join(f"{k} {usage[k]}" for k in ("prompt_tokens", "completion_tokens") if k in usage) or "no counts"


# -- finish reasons -------------------------------------------------------------------------------


def _reason(name: str, want: str) -> Any:
    return reason_check(name, want, stream_problem=_stream_problem, completion_problem=_completion_problem)


def _n_choices(readings: Readings) -> Finding:
    for side, reading in (("stream", readings.streams["n2"]), ("JSON", readings.completions["n2"])):
        problem = _stream_problem(readings, "n2", reading) if side == "stream" else _completion_problem(readings, "n2", reading)
        if problem:
            return Mark.NOT_TESTED, problem
        indices = sorted(reading.choices)
        if indices != [0, 1]:
            return Mark.FAIL, f"{side} n=2 carried choices {indices}, expected [0, 1]"
        empty = [c.index for c in reading.choices.values() if not (c.content or c.tool_calls)]
        if empty:
            return Mark.FAIL, f"{side} n=2: choice {empty[0]} carried no content"
    return Mark.PASS, "stream and JSON each carried choices 0 and 1 with content"


# -- non-streaming ---------------------------------------------------------------------------------


def _json_finish_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.completions.items():
        if _completion_problem(readings, name, reading):
            continue
        judged += 1
        for choice in reading.choices.values():
            if choice.finish_reason is None:
                given = repr(choice.reasons_seen[-1]) if choice.reasons_seen else "null or missing"
                return (
                    Mark.FAIL,
                    f"JSON {readings.label(name)}: choice {choice.index} finish_reason is {given}; the core: {reading.detail}",
                )
    if not judged:
        return Mark.NOT_TESTED, "no completion answered (see json-no-error)"
    return Mark.PASS, f"every choice of {judged} completions has a non-empty finish_reason"


SERVER_CHECKS = (
    ServerCheck(
        rule="streaming",
        check="stream-no-error",
        title="every stream completes: no error event, no cut",
        judge=stream_no_error,
        notes_retries=True,
    ),
    ServerCheck(
        rule="streaming",
        check="stream-finish-reason",
        title="every choice gets a non-empty finish_reason before [DONE]",
        judge=_stream_finish_reason,
    ),
    ServerCheck(
        rule="streaming",
        check="stream-null-not-empty",
        title='intermediate chunks say "finish_reason": null, never ""',
        judge=_stream_null_not_empty,
    ),
    ServerCheck(
        rule="streaming",
        check="stream-done-last",
        title="data: [DONE] ends every stream, once, nothing after it",
        judge=_stream_done_last,
    ),
    ServerCheck(
        rule="streaming",
        check="stream-usage-after-finish",
        title="include_usage: a usage-only chunk after every finish chunk",
        judge=_stream_usage_after_finish,
    ),
    ServerCheck(rule="finish reasons", check="reason-stop", title="a natural stop ends with stop", judge=_reason("stop", "stop")),
    ServerCheck(
        rule="finish reasons",
        check="reason-length",
        title="a max_tokens truncation ends with length",
        judge=_reason("length", "length"),
    ),
    ServerCheck(
        rule="finish reasons",
        check="reason-tool-calls",
        title="a forced tool call ends with tool_calls and a JSON call",
        judge=tool_call_check(
            "tool_call", "tool_calls", limit="length", stream_problem=_stream_problem, completion_problem=_completion_problem
        ),
    ),
    ServerCheck(rule="finish reasons", check="n-choices", title="n=2 gives choices 0 and 1", judge=_n_choices),
    ServerCheck(
        rule="non-streaming",
        check="json-no-error",
        title="every non-streamed answer is a completion, not an error",
        judge=json_no_error(),
        reads_streams=False,
        notes_retries=True,
    ),
    ServerCheck(
        rule="non-streaming",
        check="json-finish-reason",
        title="every choice of a completion has a non-empty finish_reason",
        judge=_json_finish_reason,
        reads_streams=False,
    ),
    ServerCheck(
        rule="non-streaming",
        check="stream-json-agree",
        title="streamed and non-streamed answers agree on reason and content",
        judge=stream_json_agree(stream_problem=_stream_problem, completion_problem=_completion_problem),
    ),
)

#: Chat Completions (`/chat/completions`): the checks as they always were.
CHAT_SUITE = ServerSuite(dialect=Dialect.CHAT, path="/chat/completions", requests=REQUESTS, checks=SERVER_CHECKS)
