"""The server checks in Anthropic Messages (`POST .../messages`): what to ask, how each answer is judged.

Theory of operation
-------------------
The grader sends three requests, each streamed and not: a natural stop, a `max_tokens=5`
truncation and a forced tool call (`tool_choice: {"type": "any"}` with one `get_weather` tool,
`max_tokens` 64); every
request carries `max_tokens`, which the Messages API requires. The core reads every stream as a
Messages stream (`StreamRepair(dialect=Dialect.MESSAGES)`) and every JSON `message` with rule M7;
its verdicts are what the checks map to marks:

- `messages-no-error`: the core booked no stream `upstream_error` (an `event: error`, M5) or
  `interrupted` (a cut before any `stop_reason`, M4; a bare `data: {"error":...}` frame is such a
  cut, since the Anthropic SDKs skip it).
- `messages-stop-reason`: no stream needed M2 (the core injecting a `message_delta` with a
  `stop_reason` before `message_stop`): a `message_delta` carried a non-empty `stop_reason`.
- `messages-stop-last`: no stream needed M3 ("terminator lost"), and nothing came after
  `message_stop`.
- `messages-json-stop-reason`: M7 says `clean` for every `message`.

Chat's `stream-null-not-empty`, `stream-usage-after-finish` and `n-choices` mean nothing here
(`MESSAGES_SUITE.not_run` says why). Each way of ending badly fails the check named after it, and a
check whose subject is missing is `not tested` naming the check that failed, as in Chat.
"""

from __future__ import annotations

from typing import Any

from finishline import Dialect
from labs.grade.card import Finding, Mark
from labs.grade.server_check import (
    TOOL_CALL_TOKENS,
    Readings,
    ServerCheck,
    ServerRequest,
    ServerSuite,
    completion_problem_for,
    stream_problem_for,
)
from labs.grade.server_checks import (
    json_no_error,
    reason_check,
    stream_json_agree,
    stream_no_error,
    tool_call_check,
    tool_call_shape,
)
from labs.scenario import WORKER_TOOL

__all__ = ["MESSAGES_REQUESTS", "MESSAGES_SUITE", "MESSAGES_TOOL"]

#: The worker's one tool, declared the Anthropic way (`name`, `description`, `input_schema`).
MESSAGES_TOOL = {
    "name": WORKER_TOOL["function"]["name"],
    "description": WORKER_TOOL["function"]["description"],
    "input_schema": WORKER_TOOL["function"]["parameters"],
}
#: Room for a whole natural answer: Messages has no default, `max_tokens` is required.
_ROOM = 1024
_LONG_PROMPT = "Write the numbers from 1 to 200 in words, separated by commas."
_SHORT_PROMPT = "Say the sentence about the quick brown fox."


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


MESSAGES_REQUESTS = (
    ServerRequest(name="stop", label="a natural stop", fields={"max_tokens": _ROOM, "messages": _user(_SHORT_PROMPT)}),
    ServerRequest(name="length", label="max_tokens=5", fields={"max_tokens": 5, "messages": _user(_LONG_PROMPT)}),
    ServerRequest(
        name="tool_call",
        label=f'a forced tool call (tool_choice {{"type": "any"}}, max_tokens={TOOL_CALL_TOKENS})',
        fields={
            "max_tokens": TOOL_CALL_TOKENS,
            "messages": _user("What is the weather in Paris? Use the tool."),
            "tools": [MESSAGES_TOOL],
            "tool_choice": {"type": "any"},
        },
    ),
)

_stream_problem = stream_problem_for("messages-no-error")
#: What a Chat-minded server sends for an error: data only, which both Anthropic SDKs skip.
_BARE_ERROR_NOTE = 'its data: {"error": ...} frame has no event: error line, which the Anthropic SDKs skip'


def _no_error(readings: Readings) -> Finding:
    """`stream_no_error`, saying so when the cut was a bare error frame the core does not count."""
    mark, evidence = stream_no_error(readings)
    if mark is Mark.FAIL:
        failed = next(r for r in readings.streams.values() if r.status != 200 or r.error_positions or r.report.interruption)
        if any(kind == "event" and "error" in value and "type" not in value for kind, value in failed.events):
            evidence += f"; {_BARE_ERROR_NOTE}"
    return mark, evidence


_completion_problem = completion_problem_for("messages-json-no-error", "a message")


def _given(reading: Any) -> str:
    """What a stream's last `message_delta` said about the stop reason, in words."""
    deltas = [value for _, value in reading.events if isinstance(value, dict) and value.get("type") == "message_delta"]
    if not deltas:
        return "no message_delta came"
    delta = deltas[-1].get("delta")
    if not isinstance(delta, dict):
        delta = {}
    if "stop_reason" not in delta:
        return "its message_delta has no stop_reason"
    return f"its message_delta says stop_reason {'null' if delta['stop_reason'] is None else repr(delta['stop_reason'])}"


def _stop_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if _stream_problem(readings, name, reading):
            continue
        judged += 1
        choice = reading.choices.get(0)
        if choice is None or choice.finish_reason is None:
            injected = [r for r in reading.report.repairs if "injected stop_reason" in r]
            why = f"; the core: {injected[0]}" if injected else ""
            return (
                Mark.FAIL,
                f"stream {readings.label(name)}: no non-empty stop_reason before message_stop ({_given(reading)}){why}",
            )
    if not judged:
        return Mark.NOT_TESTED, "no stream completed (see messages-no-error)"
    return Mark.PASS, f"{judged} streams: a message_delta with a non-empty stop_reason before message_stop"


def _stop_last(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if _stream_problem(readings, name, reading):
            continue  # an error event ends a stream, nothing after it (M5); a cut is messages-no-error's
        judged += 1
        done = reading.done_positions
        if not done:
            lost = [r for r in reading.report.repairs if "terminator lost" in r]
            why = f"; the core: {lost[0]}" if lost else ""
            return (
                Mark.FAIL,
                f"stream {readings.label(name)} ended without message_stop ({reading.ending}, last event: {reading.last_event}){why}",
            )
        if len(done) > 1 or done[-1] != len(reading.events) - 1:
            return (
                Mark.FAIL,
                f"stream {readings.label(name)}: {len(reading.events) - 1 - done[0]} events after the first message_stop",
            )
    if not judged:
        return Mark.NOT_TESTED, "no stream completed (see messages-no-error)"
    return Mark.PASS, f"{judged} streams each end with exactly one message_stop"


def _json_stop_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.completions.items():
        if _completion_problem(readings, name, reading):
            continue
        judged += 1
        choice = reading.choices[0]
        if choice.finish_reason is None:
            given = repr(choice.reasons_seen[-1]) if choice.reasons_seen else "null or missing"
            return Mark.FAIL, f"JSON {readings.label(name)}: stop_reason is {given}; the core: {reading.detail}"
    if not judged:
        return Mark.NOT_TESTED, "no message answered (see messages-json-no-error)"
    return Mark.PASS, f"{judged} messages, each with a non-empty stop_reason"


def _reason(name: str, want: str, extra: Any = None) -> Any:
    return reason_check(
        name,
        want,
        extra,
        stream_problem=_stream_problem,
        completion_problem=_completion_problem,
        see="messages-stop-reason, messages-json-stop-reason",
        reason_words="stop_reason",
    )


def _tool_use_shape(choice: Any) -> str | None:
    return tool_call_shape(choice, reason="stop_reason tool_use")


def _tool_use(name: str) -> Any:
    return tool_call_check(
        name,
        "tool_use",
        limit="max_tokens",
        shape=_tool_use_shape,
        stream_problem=_stream_problem,
        completion_problem=_completion_problem,
        see="messages-stop-reason, messages-json-stop-reason",
        reason_words="stop_reason",
    )


MESSAGES_SUITE = ServerSuite(
    dialect=Dialect.MESSAGES,
    path="/messages",
    requests=MESSAGES_REQUESTS,
    checks=(
        ServerCheck(
            rule="streaming",
            check="messages-no-error",
            title="every stream completes: no error event, no cut (M4, M5)",
            judge=_no_error,
            notes_retries=True,
        ),
        ServerCheck(
            rule="streaming",
            check="messages-stop-reason",
            title="a message_delta carries a non-empty stop_reason before message_stop (M2)",
            judge=_stop_reason,
        ),
        ServerCheck(
            rule="streaming",
            check="messages-stop-last",
            title="message_stop ends every stream, once, nothing after it (M3)",
            judge=_stop_last,
        ),
        ServerCheck(
            rule="stop reasons",
            check="messages-reason-end-turn",
            title="a natural stop ends with end_turn",
            judge=_reason("stop", "end_turn"),
        ),
        ServerCheck(
            rule="stop reasons",
            check="messages-reason-max-tokens",
            title="a max_tokens truncation ends with max_tokens",
            judge=_reason("length", "max_tokens"),
        ),
        ServerCheck(
            rule="stop reasons",
            check="messages-reason-tool-use",
            title="a forced tool call ends with tool_use and a JSON input",
            judge=_tool_use("tool_call"),
        ),
        ServerCheck(
            rule="non-streaming",
            check="messages-json-no-error",
            title="every non-streamed answer is a message, not an error",
            judge=json_no_error(answer="a Messages message", noun="messages"),
            reads_streams=False,
            notes_retries=True,
        ),
        ServerCheck(
            rule="non-streaming",
            check="messages-json-stop-reason",
            title="every message has a non-empty stop_reason (M7)",
            judge=_json_stop_reason,
            reads_streams=False,
        ),
        ServerCheck(
            rule="non-streaming",
            check="messages-stream-json-agree",
            title="streamed and non-streamed answers agree on reason and content",
            judge=stream_json_agree(
                stream_problem=_stream_problem,
                completion_problem=_completion_problem,
                see="messages-no-error, messages-json-no-error",
            ),
        ),
    ),
    # Anthropic's API wants its version and its key header; gateways that speak Messages accept them.
    headers={"anthropic-version": "2023-06-01"},
    api_key_header="x-api-key",
    not_run={
        "stream-null-not-empty": 'Messages has no per-chunk reason: a stop_reason of "" fails messages-stop-reason',
        "stream-usage-after-finish": "Messages has no include_usage: usage comes in message_start and message_delta",
        "n-choices": "Messages has no n: one message per request",
    },
)
