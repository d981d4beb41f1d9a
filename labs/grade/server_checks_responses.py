"""The server checks in OpenAI Responses (`POST .../responses`): what to ask, how each answer is judged.

Theory of operation
-------------------
The grader sends three requests, each streamed and not: a natural stop, a `max_output_tokens=16`
truncation (16 is the least OpenAI accepts) and a forced tool call (`tool_choice: "required"` with
one `get_weather` function, `max_output_tokens` 64). The core reads every stream as a Responses stream
(`StreamRepair(dialect=Dialect.RESPONSES)`); its verdicts are what the checks map to marks:

- `responses-no-error`: the core booked no stream `upstream_error` (`event: error`,
  `response.failed`, or a bare `data: {"error":...}` frame, R4), and no transport failed mid-body.
- `responses-terminal-event`: no stream was cut by a clean end before a terminal event (R3: only
  `response.completed`, `response.incomplete`, `response.failed` or `error` end a Responses stream,
  and finish_fix never makes one up, R2), and nothing but a `data: [DONE]` came after it (R1).

The core has no rule on the terminal response's `status`, on `sequence_number`s or on a whole JSON
`response` (it passes one as it came), so those checks read the answers themselves, as Chat's
`stream-null-not-empty` does: `responses-terminal-status` (the status is the terminal event's own
word), `responses-sequence-numbers` (each event's number above the one before; the AI SDK requires
them), `responses-json-status`, and `responses-reason-incomplete` (a truncation ends with the event,
the status and the `incomplete_details.reason` the spec gives it: llama.cpp and Ollama say
`completed`, which this check exists to catch).

Chat's `stream-null-not-empty`, `stream-usage-after-finish` and `n-choices` mean nothing here
(`RESPONSES_SUITE.not_run` says why).
"""

from __future__ import annotations

from typing import Any

from finishline import CutCause, Dialect
from labs.grade.card import Finding, Mark
from labs.grade.reading import StreamReading
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
    status_evidence,
    stream_json_agree,
    tool_call_check,
    tool_call_shape,
)
from labs.scenario import WORKER_TOOL

__all__ = ["RESPONSES_REQUESTS", "RESPONSES_SUITE", "RESPONSES_TOOL", "TERMINAL_STATUS"]

#: The worker's one tool, declared the Responses way (a flat function).
RESPONSES_TOOL = {"type": "function", **WORKER_TOOL["function"]}
#: The terminal events that end an answer, and the `status` each one's response must carry.
TERMINAL_STATUS = {"response.completed": "completed", "response.incomplete": "incomplete"}
#: The least `max_output_tokens` OpenAI accepts (below it: HTTP 400).
_LEAST_OUTPUT_TOKENS = 16
_LONG_PROMPT = "Write the numbers from 1 to 200 in words, separated by commas."
_SHORT_PROMPT = "Say the sentence about the quick brown fox."
#: What a Responses stream may send after its terminal event (R1).
_DONE_MARKER = "[DONE]"

RESPONSES_REQUESTS = (
    ServerRequest(name="stop", label="a natural stop", fields={"input": _SHORT_PROMPT}),
    ServerRequest(
        name="length",
        label=f"max_output_tokens={_LEAST_OUTPUT_TOKENS}",
        fields={"input": _LONG_PROMPT, "max_output_tokens": _LEAST_OUTPUT_TOKENS},
    ),
    ServerRequest(
        name="tool_call",
        label=f'a forced tool call (tool_choice "required", max_output_tokens={TOOL_CALL_TOKENS})',
        fields={
            "input": "What is the weather in Paris? Use the tool.",
            "tools": [RESPONSES_TOOL],
            "tool_choice": "required",
            "max_output_tokens": TOOL_CALL_TOKENS,
        },
    ),
)

_stream_problem = stream_problem_for("responses-no-error")
_completion_problem = completion_problem_for("responses-json-no-error", "a response")


def _cut_in_transit(reading: StreamReading) -> bool:
    """The transport failed (or the grader gave up waiting): not a missing terminal event."""
    cut = reading.report.interruption
    return cut is not None and cut.cause is not CutCause.CLEAN_END


def _unfinished(readings: Readings, name: str, reading: StreamReading) -> str | None:
    """Why a stream cannot be judged beyond its ending: an error, or no terminal event."""
    problem = _stream_problem(readings, name, reading)
    if problem and reading.report.interruption is not None and not _cut_in_transit(reading):
        return f"stream {readings.label(name)} ended without a terminal event (see responses-terminal-event)"
    return problem


def _no_error(readings: Readings) -> Finding:
    for name, reading in readings.streams.items():
        label = readings.label(name)
        if reading.status != 200:
            return Mark.FAIL, status_evidence(readings, name, reading)
        if reading.error_positions:
            kind = reading.types()[reading.error_positions[0]] or "a bare error frame"
            return Mark.FAIL, f"stream {label} sent {kind} after {reading.error_positions[0]} events: {reading.error_message()}"
        if _cut_in_transit(reading):
            return Mark.FAIL, f"stream {label}: {reading.report.detail}"
    return Mark.PASS, f"{len(readings.streams)} streams, none with an error event, response.failed or a transport failure"


def _terminal_event(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if reading.status != 200 or reading.error_positions or _cut_in_transit(reading):
            continue  # responses-no-error's
        judged += 1
        done = reading.done_positions
        if not done:
            return Mark.FAIL, (
                f"stream {readings.label(name)} ended without response.completed or response.incomplete "
                f"({reading.ending}, last event: {reading.last_event}); the core: {reading.report.detail}"
            )
        after = [value for _, value in reading.events[done[0] + 1 :] if value != _DONE_MARKER]
        if len(done) > 1 or after:
            return Mark.FAIL, f"stream {readings.label(name)}: {len(after) + len(done) - 1} events after {reading.terminal_type}"
    if not judged:
        return Mark.NOT_TESTED, "no stream ended without an error (see responses-no-error)"
    return Mark.PASS, f"{judged} streams each end with one terminal event"


def _status_words(status: Any) -> str:
    return "null" if status is None else repr(status)


def _terminal_status(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if _unfinished(readings, name, reading):
            continue
        judged += 1
        value = reading.events[reading.done_positions[0]][1]
        response = value.get("response") if isinstance(value.get("response"), dict) else {}
        terminal = reading.terminal_type
        assert terminal is not None, "a stream judged here ended in a terminal event (`_unfinished`)"
        want = TERMINAL_STATUS[terminal]
        if response.get("status") != want:
            return (
                Mark.FAIL,
                f"stream {readings.label(name)}: {reading.terminal_type} carries status {_status_words(response.get('status'))}, expected {want!r}",
            )
    if not judged:
        return Mark.NOT_TESTED, "no stream ended with a terminal event (see responses-no-error, responses-terminal-event)"
    return Mark.PASS, f"{judged} streams: each terminal response's status is its event's own word"


def _sequence_numbers(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if reading.status != 200:
            continue
        judged += 1
        last = None
        for position, (kind, value) in enumerate(reading.events):
            if kind == "error" or not isinstance(value, dict):
                continue  # an error frame is responses-no-error's (vLLM's bare one has no number)
            number = value.get("sequence_number")
            if not isinstance(number, int) or isinstance(number, bool):
                return (
                    Mark.FAIL,
                    f"stream {readings.label(name)}: event {position + 1} ({value.get('type')}) has no integer sequence_number",
                )
            if last is not None and number <= last:
                return (
                    Mark.FAIL,
                    f"stream {readings.label(name)}: event {position + 1} ({value.get('type')}) has sequence_number {number} after {last}",
                )
            last = number
    if not judged:
        return Mark.NOT_TESTED, "no stream answered 200 (see responses-no-error)"
    return Mark.PASS, f"{judged} streams: every event's sequence_number above the one before"


def _json_status(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.completions.items():
        if _completion_problem(readings, name, reading):
            continue
        judged += 1
        status = reading.body.get("status")
        if status not in TERMINAL_STATUS.values():
            return Mark.FAIL, f"JSON {readings.label(name)}: status {_status_words(status)}, expected 'completed' or 'incomplete'"
    if not judged:
        return Mark.NOT_TESTED, "no response answered (see responses-json-no-error)"
    return Mark.PASS, f"{judged} responses, each completed or incomplete"


#: What a truncation by `max_output_tokens` ends with, per the spec: the event, the response's
#: status, and its `incomplete_details.reason`.
_TRUNCATED = ("response.incomplete", "incomplete", "max_output_tokens")


def _output_tokens(response: dict[str, Any]) -> int | None:
    usage = response.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def _truncation_words(event: str | None, response: dict[str, Any]) -> tuple[tuple[str | None, Any, Any], str]:
    """What a truncated answer ended with (event, status, `incomplete_details.reason`), and in words."""
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    words = [event] if event else []
    words.append(f"status {_status_words(response.get('status'))}")
    words.append(f"incomplete_details.reason {reason!r}" if isinstance(details, dict) else "no incomplete_details")
    tokens = _output_tokens(response)
    if tokens is not None:
        words.append(f"output_tokens {tokens}")
    return (event, response.get("status"), reason), ", ".join(words)


#: How one side of a request ended: why it cannot be judged (or None), its terminal event's type
#: (None for JSON), and the final response.
_Ending = tuple[str | None, str | None, dict[str, Any]]


def _stream_ending(readings: Readings, name: str) -> _Ending | None:
    reading = readings.streams.get(name)
    if reading is None:
        return None
    problem = _unfinished(readings, name, reading)
    if problem:
        return problem, None, {}
    value = reading.events[reading.done_positions[0]][1]
    response = value.get("response") if isinstance(value, dict) else None
    return None, reading.terminal_type, response if isinstance(response, dict) else {}


def _json_ending(readings: Readings, name: str) -> _Ending | None:
    reading = readings.completions.get(name)
    if reading is None:
        return None
    problem = _completion_problem(readings, name, reading)
    return problem, None, reading.body if not problem and isinstance(reading.body, dict) else {}


def _truncation(name: str) -> Any:
    """A judge: request `name` (a `max_output_tokens` cap on a long answer) ends, streamed, with
    `response.incomplete`, status `incomplete` and `incomplete_details.reason: max_output_tokens`,
    and as JSON with that status and reason. llama.cpp and Ollama end it `response.completed`,
    status `completed` (shared/notes/real-servers.md): an agent that reads `status` to decide
    whether to continue is told the answer is whole, so that is a fail, with what came in evidence.
    An answer whose `usage.output_tokens` is below the cap stopped by itself, so there was no
    truncation to judge (`not tested`); no status at all is `responses-terminal-status`'s."""

    def judge(readings: Readings) -> Finding:
        label = readings.label(name)
        cap = next(r.fields["max_output_tokens"] for r in readings.requests if r.name == name)
        seen = []
        for side, ended in (("stream", _stream_ending(readings, name)), ("JSON", _json_ending(readings, name))):
            if ended is None:
                continue
            problem, terminal, response = ended
            if problem:
                return Mark.NOT_TESTED, problem
            want = _TRUNCATED if side == "stream" else (None, *_TRUNCATED[1:])
            if not response.get("status"):
                return (
                    Mark.NOT_TESTED,
                    f"{side} {label}: no status given to judge (see responses-terminal-status, responses-json-status)",
                )
            got, words = _truncation_words(terminal, response)
            tokens = _output_tokens(response)
            if got != want and tokens is not None and tokens < cap:
                return Mark.NOT_TESTED, f"{side} {label}: the model stopped by itself ({words}): no truncation to judge"
            if got != want:
                expected = ", ".join(w for w in (want[0], f"status {want[1]!r}", f"incomplete_details.reason {want[2]!r}") if w)
                return Mark.FAIL, f"{side} {label} ended with {words}; a truncation ends with {expected}"
            seen.append(f"{side}: {words}")
        return Mark.PASS, f"{label}: " + "; ".join(seen)

    return judge


def _reason(name: str, want: str, extra: Any = None) -> Any:
    return reason_check(
        name,
        want,
        extra,
        stream_problem=_unfinished,
        completion_problem=_completion_problem,
        see="responses-terminal-status, responses-json-status",
        reason_words="status",
    )


def _function_call_shape(choice: Any) -> str | None:
    return tool_call_shape(choice, reason="status completed")


def _function_call(name: str) -> Any:
    # `completed` is also a text answer's status: only a call, or its absence, tells them apart.
    return tool_call_check(
        name,
        "completed",
        limit="incomplete",
        shape=_function_call_shape,
        reason_names_a_call=False,
        stream_problem=_unfinished,
        completion_problem=_completion_problem,
        see="responses-terminal-status, responses-json-status",
        reason_words="status",
    )


RESPONSES_SUITE = ServerSuite(
    dialect=Dialect.RESPONSES,
    path="/responses",
    requests=RESPONSES_REQUESTS,
    checks=(
        ServerCheck(
            rule="streaming",
            check="responses-no-error",
            title="no stream sends error, response.failed or is cut in transit (R4)",
            judge=_no_error,
            notes_retries=True,
        ),
        ServerCheck(
            rule="streaming",
            check="responses-terminal-event",
            title="a terminal event ends every stream, nothing after it but [DONE] (R1, R3)",
            judge=_terminal_event,
        ),
        ServerCheck(
            rule="streaming",
            check="responses-terminal-status",
            title="the terminal response's status is its event's word (completed, incomplete)",
            judge=_terminal_status,
        ),
        ServerCheck(
            rule="streaming",
            check="responses-sequence-numbers",
            title="every event carries a sequence_number above the one before",
            judge=_sequence_numbers,
        ),
        ServerCheck(
            rule="statuses",
            check="responses-reason-completed",
            title="a natural stop ends completed",
            judge=_reason("stop", "completed"),
        ),
        ServerCheck(
            rule="statuses",
            check="responses-reason-incomplete",
            title="a max_output_tokens truncation ends response.incomplete, incomplete_details.reason max_output_tokens",
            judge=_truncation("length"),
        ),
        ServerCheck(
            rule="statuses",
            check="responses-reason-tool-call",
            title="a forced tool call ends completed with a JSON function call",
            judge=_function_call("tool_call"),
        ),
        ServerCheck(
            rule="non-streaming",
            check="responses-json-no-error",
            title="every non-streamed answer is a response, not an error or failed",
            judge=json_no_error(answer="a Responses response", noun="responses"),
            reads_streams=False,
            notes_retries=True,
        ),
        ServerCheck(
            rule="non-streaming",
            check="responses-json-status",
            title="every response's status is completed or incomplete",
            judge=_json_status,
            reads_streams=False,
        ),
        ServerCheck(
            rule="non-streaming",
            check="responses-stream-json-agree",
            title="streamed and non-streamed answers agree on status and content",
            judge=stream_json_agree(
                stream_problem=_unfinished,
                completion_problem=_completion_problem,
                see="responses-no-error, responses-terminal-event, responses-json-no-error",
            ),
        ),
    ),
    not_run={
        "stream-null-not-empty": "Responses has no per-chunk reason: the terminal response's status is responses-terminal-status's",
        "stream-usage-after-finish": "Responses has no include_usage: usage comes in the terminal response",
        "n-choices": "Responses has no n: one response per request",
    },
)
