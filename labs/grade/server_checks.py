"""The server checks, as data: what to ask an OpenAI-compatible server, and how each answer is judged.

This module holds the judges that read alike in every dialect and the Chat Completions suite; what
a check and a suite are (`ServerRequest`, `Readings`, `ServerCheck`, `ServerSuite`) is in
`server_check`, the Messages, Responses and Gemini suites are in `server_checks_messages`,
`server_checks_responses` and `server_checks_gemini`, and `server_suites.SERVER_SUITES` names all four.

Theory of operation
-------------------
The grader sends five requests (`REQUESTS`), each streamed and not streamed: a natural stop, a
`max_tokens` truncation, a forced tool call (`tool_choice: "required"`, at most `TOOL_CALL_TOKENS`),
`n=2`, and `stream_options.include_usage`. Every answer is read once (`labs.grade.reading`,
finishline's core as the judge) and the checks below read those readings; a check never sends
anything itself.

Each check tests one thing, so that each way of ending badly fails the check named after it and
no other: a missing reason fails `stream-finish-reason` (and `json-finish-reason`), not the check
that the truncation's reason is `length`. A check whose subject is missing (no reason to compare,
a stream that ended in an error) is `not tested`, with the check that failed named in its evidence:
it is never a pass. So is a check that needs the model to do something it did not do (the forced
tool call answered in prose: `tool_call_check`): a real model's limit is not the server's fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from finishline import Dialect
from labs.grade.card import Finding, Mark, shortened
from labs.grade.reading import StreamReading
from labs.grade.server_check import (
    TOOL_CALL_TOKENS,
    Problem,
    Readings,
    ServerCheck,
    ServerRequest,
    ServerSuite,
    completion_problem_for,
    stream_problem_for,
)
from labs.outcome import canonical_reason
from labs.scenario import WORKER_TOOL

__all__ = [
    "CHAT_SUITE",
    "REQUESTS",
    "SERVER_CHECKS",
    "json_no_error",
    "reason_check",
    "status_evidence",
    "stream_json_agree",
    "stream_no_error",
    "tool_call_check",
    "tool_call_shape",
]


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


def status_evidence(readings: Readings, name: str, reading: StreamReading) -> str:
    """A stream that did not answer 200: its status and body, or what happened instead of a head."""
    if not reading.status:
        return f"stream {readings.label(name)}: {reading.status_words()}"
    return f"stream {readings.label(name)}: HTTP {reading.status}: {shortened(reading.body, 200)}"


def stream_no_error(readings: Readings) -> Finding:
    """Every stream answered 200 and completed: no error event, no cut (as the core books them)."""
    for name, reading in readings.streams.items():
        if reading.status != 200:
            return Mark.FAIL, status_evidence(readings, name, reading)
        if reading.error_positions:
            return (
                Mark.FAIL,
                f"stream {readings.label(name)} sent an error event after {reading.error_positions[0]} events: {reading.error_message()}",
            )
        if reading.report.interruption is not None:
            return Mark.FAIL, f"stream {readings.label(name)}: {reading.report.detail}"
    return Mark.PASS, f"{len(readings.streams)} streams, each completed without an error event or a cut"


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


# -- finish reasons (the value, where one was given): every dialect's --------------------------------


def _choices_0(
    readings: Readings, name: str, stream_problem: Problem, completion_problem: Problem
) -> Iterator[tuple[str, Any, Finding | None]]:
    """Request `name`'s choice 0 on each side read, stream then JSON, as `(side, choice, None)`; or,
    last, `(side, None, finding)` for the side that ends the judging: `not tested` for a reading
    with a problem (`stream_problem`, `completion_problem`), a fail for one with no choice 0. Lazy,
    so a judge's verdict on the stream side comes before any on the JSON side."""
    for side, reading in (("stream", readings.streams.get(name)), ("JSON", readings.completions.get(name))):
        if reading is None:
            continue
        problem = stream_problem(readings, name, reading) if side == "stream" else completion_problem(readings, name, reading)
        if problem:
            yield side, None, (Mark.NOT_TESTED, problem)
            return
        choice = reading.choices.get(0)
        if choice is None:
            yield side, None, (Mark.FAIL, f"{side} {readings.label(name)}: no choice 0")
            return
        yield side, choice, None


def reason_check(
    name: str,
    want: str,
    extra: Callable[[Any], str | None] | None = None,
    *,
    stream_problem: Problem = _stream_problem,
    completion_problem: Problem = _completion_problem,
    see: str = "stream-finish-reason, json-finish-reason",
    reason_words: str = "finish_reason",
) -> Callable[[Readings], Finding]:
    """A judge: request `name`'s choice 0 ended with `want` (the dialect's word, read through
    `canonical_reason`), streamed and not, and `extra(choice)` finds nothing wrong with it. No reason
    on either side is `not tested`, naming the checks `see` that judge its presence."""

    def judge(readings: Readings) -> Finding:
        seen = []
        for side, choice, finding in _choices_0(readings, name, stream_problem, completion_problem):
            if finding is not None:
                return finding
            reason = canonical_reason(choice.finish_reason, readings.dialect)
            if reason is None:
                seen.append(f"{side}: none")
                continue
            if reason != want:
                return Mark.FAIL, f"{side} {readings.label(name)} ended with {choice.finish_reason!r}, expected {want!r}"
            if extra is not None:
                trouble = extra(choice)
                if trouble:
                    return Mark.FAIL, f"{side} {readings.label(name)}: {trouble}"
            seen.append(f"{side}: {want}")
        if all(s.endswith("none") for s in seen):
            return Mark.NOT_TESTED, f"{readings.label(name)}: no {reason_words} given to judge (see {see})"
        return Mark.PASS, f"{readings.label(name)}: " + ", ".join(seen)

    return judge


def tool_call_check(
    name: str,
    want: str,
    *,
    limit: str,
    shape: Callable[[Any], str | None] | None = None,
    reason_names_a_call: bool = True,
    stream_problem: Problem = _stream_problem,
    completion_problem: Problem = _completion_problem,
    see: str = "stream-finish-reason, json-finish-reason",
    reason_words: str = "finish_reason",
) -> Callable[[Readings], Finding]:
    """A judge for the forced tool call `name`: the check needs the model to call a tool, so it is
    `not tested` when the model did not (plain text, often to the request's limit: a model whose
    chat template has no tools, such as SmolLM2 on llama.cpp, writes prose however the server is
    asked), or when its call did not fit in the limit (`limit`, the dialect's word for a cap hit).
    A fail is kept for a protocol fault: a call made and a reason other than `want` given, a call
    that is not a JSON `get_weather` call (`shape`, default `tool_call_shape`), or, where
    `reason_names_a_call`, the reason `want` with no call at all. A call with no reason is `not
    tested`, naming the checks `see` that fail it."""

    def judge(readings: Readings) -> Finding:
        label = readings.label(name)
        called: list[str] = []
        uncalled: list[tuple[str, str]] = []  # (side, what the model did instead)
        reasonless_call = False  # a call with no reason: the presence checks `see` fail it
        for side, choice, finding in _choices_0(readings, name, stream_problem, completion_problem):
            if finding is not None:
                return finding
            reason = canonical_reason(choice.finish_reason, readings.dialect)
            given = "no reason" if reason is None else f"{reason_words} {choice.finish_reason}"
            if not choice.tool_calls:
                if reason == want and reason_names_a_call:
                    return Mark.FAIL, f"{side} {label}: {reason_words} {choice.finish_reason} but no tool call"
                to_the_limit = " to the limit" if reason == limit else ""
                uncalled.append((side, f"plain text{to_the_limit} ({given}, {len(choice.content)} characters)"))
            elif reason is None:
                reasonless_call = True
            elif reason == limit and reason != want:
                uncalled.append((side, f"a call cut at the limit ({given})"))
            elif reason != want:
                return (
                    Mark.FAIL,
                    f"{side} {label}: a tool call was made, but it ended with {choice.finish_reason!r}, expected {want!r}",
                )
            elif trouble := (shape or tool_call_shape)(choice):
                return Mark.FAIL, f"{side} {label}: {trouble}"
            else:
                called.append(f"{side}: {want}")
        if called:
            made_none = [f"{side}: no whole call, {instead}" for side, instead in uncalled]
            return Mark.PASS, f"{label}: " + ", ".join([*called, *made_none])
        if uncalled and not reasonless_call:
            instead = "; ".join(f"{side}: {what}" for side, what in uncalled)
            return Mark.NOT_TESTED, (
                f"{label}: the model made no whole tool call ({instead}): the check needs a model that calls tools; "
                "not a protocol fault"
            )
        return Mark.NOT_TESTED, f"{label}: no {reason_words} given to judge (see {see})"

    return judge


def tool_call_shape(choice: Any, *, reason: str = "tool_calls") -> str | None:
    """What is wrong with a choice that ended in a tool call (None: a `get_weather` call with JSON
    arguments); `reason` is the dialect's word, for the evidence."""
    if not choice.tool_calls:
        return f"finish_reason {reason} but no tool call" if reason == "tool_calls" else f"{reason} but no tool call"
    call = choice.tool_calls[0]
    if call["name"] != WORKER_TOOL["function"]["name"]:
        return f"tool call {call['name']!r}, the only tool offered is {WORKER_TOOL['function']['name']!r}"
    try:
        json.loads(call["arguments"] or "")
    except ValueError:
        return f"tool call arguments are not JSON: {shortened(call['arguments'], 80)!r}"
    return None


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


# -- non-streaming: every dialect's ------------------------------------------------------------------


def json_no_error(*, answer: str = "a chat.completion with choices", noun: str = "completions") -> Callable[[Readings], Finding]:
    """A judge: every JSON answer is a 200 carrying `answer`, not an error status or an error body."""

    def judge(readings: Readings) -> Finding:
        for name, reading in readings.completions.items():
            if reading.failure is not None or reading.status != 200:
                return Mark.FAIL, f"JSON {readings.label(name)}: {reading.status_words()}"
            if reading.error is not None:
                return (
                    Mark.FAIL,
                    f"JSON {readings.label(name)}: status 200 with an error body: {shortened(str(reading.error), 160)}",
                )
            if not reading.choices:
                return Mark.FAIL, f"JSON {readings.label(name)}: not {answer}"
        return Mark.PASS, f"{len(readings.completions)} {noun}, none an error"

    return judge


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


def stream_json_agree(
    *,
    stream_problem: Problem = _stream_problem,
    completion_problem: Problem = _completion_problem,
    see: str = "stream-no-error, json-no-error",
) -> Callable[[Readings], Finding]:
    """A judge: per request and choice, the streamed and the JSON answer agree on the reason (in the
    dialect's words), the content and the tool calls' names."""

    def judge(readings: Readings) -> Finding:
        compared = 0
        for name, completion in readings.completions.items():
            stream = readings.streams[name]
            if stream_problem(readings, name, stream) or completion_problem(readings, name, completion):
                continue
            compared += 1
            label = readings.label(name)
            for index in sorted(set(stream.choices) | set(completion.choices)):
                got, want = stream.choices.get(index), completion.choices.get(index)
                if got is None or want is None:
                    return Mark.FAIL, f"{label}: choice {index} only in the {'JSON' if got is None else 'stream'}"
                if canonical_reason(got.finish_reason, readings.dialect) != canonical_reason(
                    want.finish_reason, readings.dialect
                ):
                    return (
                        Mark.FAIL,
                        f"{label}: choice {index} streamed reason {got.finish_reason!r}, JSON {want.finish_reason!r}",
                    )
                if got.content != want.content:
                    return (
                        Mark.FAIL,
                        f"{label}: choice {index} streamed {len(got.content)} characters, JSON {len(want.content)}, and they differ",
                    )
                if [c["name"] for c in got.tool_calls] != [c["name"] for c in want.tool_calls]:
                    return (
                        Mark.FAIL,
                        f"{label}: choice {index} streamed tool calls {[c['name'] for c in got.tool_calls]}, JSON {[c['name'] for c in want.tool_calls]}",
                    )
        if not compared:
            return Mark.NOT_TESTED, f"no request answered both ways without an error (see {see})"
        return Mark.PASS, f"{compared} requests: streamed and JSON answers agree on reason and content"

    return judge


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
    ServerCheck(
        rule="finish reasons", check="reason-stop", title="a natural stop ends with stop", judge=reason_check("stop", "stop")
    ),
    ServerCheck(
        rule="finish reasons",
        check="reason-length",
        title="a max_tokens truncation ends with length",
        judge=reason_check("length", "length"),
    ),
    ServerCheck(
        rule="finish reasons",
        check="reason-tool-calls",
        title="a forced tool call ends with tool_calls and a JSON call",
        judge=tool_call_check("tool_call", "tool_calls", limit="length"),
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
        judge=stream_json_agree(),
    ),
)

#: Chat Completions (`/chat/completions`): the checks as they always were.
CHAT_SUITE = ServerSuite(dialect=Dialect.CHAT, path="/chat/completions", requests=REQUESTS, checks=SERVER_CHECKS)
