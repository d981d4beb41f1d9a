"""The server checks, as data: what to ask an OpenAI-compatible server, and how each answer is judged.

This module holds what every dialect's checks share (`ServerRequest`, `Readings`, `ServerCheck`,
`ServerSuite`, the judges that read alike in every dialect, each given its dialect's `Problem`s);
the suites are in `server_checks_chat`, `server_checks_messages` and `server_checks_responses`,
and `server_suites.SERVER_SUITES` names all three.

Theory of operation
-------------------
The grader sends a suite's requests (Chat's `REQUESTS`: five), each streamed and not streamed: a
natural stop, a `max_tokens` truncation, a forced tool call (`tool_choice: "required"`, at most
`TOOL_CALL_TOKENS`), `n=2`, and `stream_options.include_usage`. Every answer is read once
(`labs.grade.reading`, finishline's core as the judge) and the checks read those readings; a check
never sends anything itself.

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
from dataclasses import dataclass, field
from typing import Any

from finishline import Dialect
from labs.grade.card import CheckResult, Finding, Mark, shortened
from labs.grade.reading import CompletionReading, StreamReading
from labs.outcome import canonical_reason
from labs.scenario import WORKER_TOOL

__all__ = [
    "TOOL_CALL_TOKENS",
    "Problem",
    "Readings",
    "ServerCheck",
    "ServerRequest",
    "ServerSuite",
    "completion_problem_for",
    "json_no_error",
    "reason_check",
    "request_body",
    "status_evidence",
    "stream_json_agree",
    "stream_no_error",
    "stream_problem_for",
    "tool_call_check",
    "tool_call_shape",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRequest:
    """One request the grader sends, streamed and not."""

    name: str
    #: In the evidence: what this request asks for.
    label: str
    fields: dict[str, Any]
    #: Only streamed (`stream_options` means nothing to a non-streamed request).
    stream_only: bool = False


#: The forced tool call's budget, in every dialect: room for a `get_weather` call (about 30 tokens
#: as Hermes-style `<tool_call>` JSON) and a few words before it, and a bound on what a model that
#: writes prose instead costs (without one, llama.cpp let SmolLM2 write until its context was full:
#: minutes on a CPU). A call that does not fit is `not tested`, never a fail (`tool_call_check`).
TOOL_CALL_TOKENS = 64


def request_body(request: ServerRequest, *, model: str, stream: bool) -> dict[str, Any]:
    """The JSON body for one request; temperature 0 so the streamed and the JSON answer can agree."""
    return {"model": model, **request.fields, "stream": stream, "temperature": 0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Readings:
    """Every answer, by request name, and what was asked (the requests' labels for the evidence)."""

    streams: dict[str, StreamReading]
    completions: dict[str, CompletionReading]
    requests: tuple[ServerRequest, ...]
    dialect: Dialect = Dialect.CHAT

    def label(self, name: str) -> str:
        """The evidence's words for request `name` (`a natural stop`, `max_tokens=5`)."""
        return next(r.label for r in self.requests if r.name == name)

    def retry_notes(self, *, streams: bool) -> list[str]:
        """The notes of the streamed (or the JSON) answers whose first attempt was sent again."""
        side, answers = ("stream", self.streams) if streams else ("JSON", self.completions)
        return [f"{side} {self.label(name)}: {reading.retry_note}" for name, reading in answers.items() if reading.retry_note]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCheck:
    rule: str
    check: str
    title: str
    judge: Callable[[Readings], Finding]
    #: It reads the streamed answers (every check but the JSON-only ones).
    reads_streams: bool = True
    #: Its evidence also notes every answer (streamed, or JSON for a JSON-only check) the grader had
    #: to ask again on a fresh connection (`labs.grade.fetch.open_response`): the dialect's
    #: no-error checks, whose subject is how the exchange went. A note, never a fail.
    notes_retries: bool = False

    def run(self, readings: Readings) -> CheckResult:
        unread = _unread_stream(readings) if self.reads_streams else None
        mark, evidence = unread or self.judge(readings)
        if self.notes_retries:
            evidence = "; ".join([evidence, *readings.retry_notes(streams=self.reads_streams)])
        return CheckResult(rule=self.rule, check=self.check, title=self.title, mark=mark, evidence=evidence)


def _unread_stream(readings: Readings) -> Finding | None:
    """`not tested` when a stream came compressed: its bytes are not SSE, and judging them as if
    they were would fail a server for the grader's own blindness."""
    for name, reading in readings.streams.items():
        if reading.compressed is not None:
            return Mark.NOT_TESTED, f"stream {readings.label(name)}: {reading.compression_note()}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSuite:
    """One dialect's checks: where to ask, what, and how each answer is judged."""

    dialect: Dialect
    #: The path under the base URL the requests go to (`/chat/completions`, `/messages`, `/responses`).
    path: str
    requests: tuple[ServerRequest, ...]
    checks: tuple[ServerCheck, ...]
    #: Chat checks that mean nothing in this dialect, and why: the card says so instead of a row.
    not_run: dict[str, str] = field(default_factory=dict)
    #: Headers every request carries (Anthropic's `anthropic-version`).
    headers: dict[str, str] = field(default_factory=dict)
    #: A header that carries `--api-key` besides the bearer token (Anthropic's `x-api-key`).
    api_key_header: str | None = None


#: Why a stream (or a JSON answer) cannot be judged beyond its dialect's no-error check, or None:
#: `(readings, request name, reading)`.
Problem = Callable[[Readings, str, Any], str | None]


def stream_problem_for(no_error_check: str) -> Problem:
    """Why a stream cannot be judged beyond `no_error_check` (the dialect's), or None: an error
    status, an error event, a cut (the core's interruption)."""

    def problem(readings: Readings, name: str, reading: StreamReading) -> str | None:
        label = readings.label(name)
        if reading.status != 200:
            return f"stream {label}: {reading.status_words()}"
        if reading.error_positions:
            return f"stream {label} ended in an error event (see {no_error_check})"
        if reading.report.interruption is not None:
            return f"stream {label} was cut: {reading.report.interruption.how} (see {no_error_check})"
        return None

    return problem


def completion_problem_for(no_error_check: str, answer: str = "a completion") -> Problem:
    """Why a JSON answer cannot be judged beyond `no_error_check`, or None."""

    def problem(readings: Readings, name: str, reading: CompletionReading) -> str | None:
        if reading.failure is not None or reading.status != 200:
            return f"JSON {readings.label(name)}: {reading.status_words()}"
        if reading.error is not None or not reading.choices:
            return f"JSON {readings.label(name)} is an error, not {answer} (see {no_error_check})"
        return None

    return problem


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
    stream_problem: Problem,
    completion_problem: Problem,
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
    stream_problem: Problem,
    completion_problem: Problem,
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


def stream_json_agree(
    *,
    stream_problem: Problem,
    completion_problem: Problem,
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
