"""The server checks in Google Gemini (`POST .../models/{model}:streamGenerateContent?alt=sse` and
`...:generateContent`): what to ask, how each answer is judged.

Theory of operation
-------------------
A Gemini stream has no terminator and no event names: the only sign that it ended well is a
`finishReason` on its last candidate chunk (shared/notes/gemini.md §2, §4), so a stream cut at a
chunk boundary looks like a clean end to most clients. The grader sends three requests, each
streamed and not: a natural stop, a `generationConfig.maxOutputTokens=5` truncation and a forced
function call (`toolConfig.functionCallingConfig.mode: "ANY"` with one `get_weather` declaration,
`maxOutputTokens` 64); the model is named in the path, the base URL ends with the API version
(`http://HOST:PORT/v1beta`). Then one request the server must refuse (a body that is not JSON),
for the error shape. The core reads every stream as Gemini (`StreamRepair(dialect=Dialect.GEMINI)`,
the `alt=sse` form or the JSON-array form alike) and every whole body with rule G6; the checks read
those readings:

- `gemini-no-error`: every stream answered 200 and came whole: no error chunk (the core's
  `upstream_error`, G4), no transport failure mid-body. A clean end without a `finishReason` is not
  this check's: it is what `gemini-finish-reason` judges.
- `gemini-finish-reason`: the last chunk carrying the first candidate carries a `finishReason`
  that is neither `""` nor `FINISH_REASON_UNSPECIFIED` (G3); else the core books the stream
  `interrupted` (G2), and the evidence quotes it. A blocked prompt (`promptFeedback.blockReason`,
  no candidates) is complete without one.
- `gemini-reason-stop`, `gemini-reason-max-tokens`, `gemini-reason-tool-call`: the reason's value,
  where one was given, as in the other dialects (`reason_check`, `tool_call_check`; a function call
  ends with `STOP`, Gemini has no tool-call reason).
- `gemini-error-shape`: the bad request gets a 4xx whose body is `{"error": {"code", "message",
  "status"}}` with `code` equal to the HTTP status (the SDKs raise from the status; the error's
  `code` is what they print and what a client's retry reads).
- `gemini-error-frame`: an error chunk a stream sent, if any, has `error` as its first key and an
  integer `code` in 400-599, a `message` and a `status` (google-genai raises only when the chunk
  re-dumps as `{"error": ...`, @google/genai only for such a code). The grader cannot make a server
  fail mid-stream: without an error chunk the check is `not tested`.
- `gemini-json-no-error`, `gemini-json-finish-reason`, `gemini-stream-json-agree`: the whole
  bodies, read by the grader itself (rule G6 passes a JSON body with its reasons as they are).

Chat's `stream-null-not-empty`, `stream-done-last`, `stream-usage-after-finish` and `n-choices`
mean nothing here (`GEMINI_SUITE.not_run` says why).
"""

from __future__ import annotations

import json
from typing import Any

from finishline import GEMINI_NO_REASONS, Dialect
from labs.grade.card import Finding, Mark, shortened
from labs.grade.dialect_reading import gemini_chunk, gemini_first_candidate
from labs.grade.reading import CLEAN_END, CompletionReading, StreamReading
from labs.grade.server_check import (
    TOOL_CALL_TOKENS,
    Readings,
    ServerCheck,
    ServerRequest,
    ServerSuite,
    completion_problem_for,
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

__all__ = ["GEMINI_BAD_REQUEST", "GEMINI_REQUESTS", "GEMINI_SUITE", "GEMINI_TOOL", "gemini_body", "gemini_request"]

#: The worker's one tool, declared the Gemini way (`functionDeclarations`).
GEMINI_TOOL = {
    "functionDeclarations": [
        {
            "name": WORKER_TOOL["function"]["name"],
            "description": WORKER_TOOL["function"]["description"],
            "parameters": WORKER_TOOL["function"]["parameters"],
        }
    ]
}
_LONG_PROMPT = "Write the numbers from 1 to 200 in words, separated by commas."
_SHORT_PROMPT = "Say the sentence about the quick brown fox."
#: What the server must refuse: a body that is not JSON (Google answers it 400 INVALID_ARGUMENT,
#: "Invalid JSON payload received").
GEMINI_BAD_REQUEST = b'{"contents": [{"role": "user", "parts": [{"text": '
_NO_ERROR, _FINISH = "gemini-no-error", "gemini-finish-reason"
_JSON_NO_ERROR, _JSON_FINISH = "gemini-json-no-error", "gemini-json-finish-reason"


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "parts": [{"text": text}]}]


GEMINI_REQUESTS = (
    ServerRequest(name="stop", label="a natural stop", fields={"contents": _user(_SHORT_PROMPT)}),
    ServerRequest(
        name="length",
        label="maxOutputTokens=5",
        fields={"contents": _user(_LONG_PROMPT), "generationConfig": {"maxOutputTokens": 5}},
    ),
    ServerRequest(
        name="tool_call",
        label=f"a forced function call (functionCallingConfig mode ANY, maxOutputTokens={TOOL_CALL_TOKENS})",
        fields={
            "contents": _user("What is the weather in Paris? Use the tool."),
            "tools": [GEMINI_TOOL],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
            "generationConfig": {"maxOutputTokens": TOOL_CALL_TOKENS},
        },
    ),
)


def gemini_body(request: ServerRequest, *, model: str, stream: bool) -> dict[str, Any]:
    """A Gemini request body: the model and whether it streams are the path's, not the body's;
    temperature 0 (in `generationConfig`) so the streamed and the whole answer can agree."""
    config = request.fields.get("generationConfig") or {}
    return {**request.fields, "generationConfig": {**config, "temperature": 0}}


def gemini_request(line: dict[str, Any]) -> dict[str, Any]:
    """The Gemini body for the lab's Chat-shaped request line (`messages`, `max_tokens`, OpenAI
    tools), as the gateway grader's byte-level reader sends it: system messages become the
    `systemInstruction`, an assistant's turn the `model` role; the model and the stream are the
    path's."""
    messages = line.get("messages") or []
    system = [m["content"] for m in messages if m.get("role") == "system"]
    body: dict[str, Any] = {
        "contents": [
            {"role": "model" if m.get("role") == "assistant" else "user", "parts": [{"text": m.get("content") or ""}]}
            for m in messages
            if m.get("role") != "system"
        ]
    }
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n".join(system)}]}
    if line.get("max_tokens"):
        body["generationConfig"] = {"maxOutputTokens": line["max_tokens"]}
    if line.get("tools"):
        declarations = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in line["tools"]
        ]
        body["tools"] = [{"functionDeclarations": declarations}]
    return body


def _stream_problem(readings: Readings, name: str, reading: StreamReading) -> str | None:
    """Why a stream cannot be judged beyond `gemini-no-error`: an error status, an error chunk, a
    transport failure. A clean end without a finishReason is judged (by `gemini-finish-reason`)."""
    label = readings.label(name)
    if reading.status != 200:
        return f"stream {label}: {reading.status_words()}"
    if reading.error_positions:
        return f"stream {label} ended in an error chunk (see {_NO_ERROR})"
    if reading.ending != CLEAN_END:
        return f"stream {label} was cut: {reading.ending} (see {_NO_ERROR})"
    return None


_completion_problem = completion_problem_for(_JSON_NO_ERROR, "a GenerateContentResponse")


def _no_error(readings: Readings) -> Finding:
    for name, reading in readings.streams.items():
        label = readings.label(name)
        if reading.status != 200:
            return Mark.FAIL, status_evidence(readings, name, reading)
        if reading.error_positions:
            position = reading.error_positions[0]
            return Mark.FAIL, f"stream {label} sent an error chunk after {position} chunks: {reading.error_message()}"
        if reading.ending != CLEAN_END:
            return Mark.FAIL, f"stream {label}: {reading.ending}; the core: {reading.report.detail}"
        unreadable = reading.unreadable_positions
        if unreadable:
            return Mark.FAIL, f"stream {label}: chunk {unreadable[0] + 1} is not a JSON object; the core: {reading.report.detail}"
    return Mark.PASS, f"{len(readings.streams)} streams, each came whole without an error chunk"


def _words(reason: object) -> str:
    """What a candidate said about its finish reason, in words."""
    return "no finishReason" if reason is None else f"finishReason {reason!r}"


def _last_candidate(reading: StreamReading) -> tuple[int, int, dict[str, Any] | None, bool]:
    """(the chunk count, the position of the last chunk carrying the first candidate, that
    candidate, whether a chunk said the prompt was blocked)."""
    chunks = [gemini_chunk(value) for value in reading.data_events()]
    last, candidate, blocked = 0, None, False
    for position, chunk in enumerate(chunks, start=1):
        if chunk is None:
            continue
        feedback = chunk.get("promptFeedback")
        blocked = blocked or (isinstance(feedback, dict) and bool(feedback.get("blockReason")))
        found = gemini_first_candidate(chunk)
        if found is not None:
            last, candidate = position, found
    return len(chunks), last, candidate, blocked


def _finished(candidate: dict[str, Any]) -> bool:
    reason = candidate.get("finishReason")
    return isinstance(reason, str) and reason not in GEMINI_NO_REASONS


def _finish_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.streams.items():
        if _stream_problem(readings, name, reading):
            continue
        judged += 1
        label = readings.label(name)
        count, last, candidate, blocked = _last_candidate(reading)
        core = f"; the core: {reading.report.detail}" if reading.report.interruption is not None else ""
        if candidate is None:
            if blocked:
                continue  # a blocked prompt: no candidate, complete as it is
            return Mark.FAIL, f"stream {label}: none of its {count} chunks carried a candidate{core}"
        if not _finished(candidate):
            earlier = "" if reading.report.interruption is not None else " (an earlier chunk had one)"
            return (
                Mark.FAIL,
                f"stream {label}: its last candidate chunk ({last} of {count}) carries {_words(candidate.get('finishReason'))}{earlier}{core}",
            )
    if not judged:
        return Mark.NOT_TESTED, f"no stream came whole (see {_NO_ERROR})"
    return Mark.PASS, f"{judged} streams: the last candidate chunk carries a finishReason"


def _reason(name: str, want: str) -> Any:
    return reason_check(
        name,
        want,
        stream_problem=_stream_problem,
        completion_problem=_completion_problem,
        see=f"{_FINISH}, {_JSON_FINISH}",
        reason_words="finishReason",
    )


def _call_shape(choice: Any) -> str | None:
    return tool_call_shape(choice, reason="finishReason STOP")


# -- errors --------------------------------------------------------------------------------------


def _error_object_trouble(error: Any) -> str | None:
    """What is wrong with an `error` object (None: `code` an integer, `message` and `status` strings)."""
    if not isinstance(error, dict):
        return f"error is {shortened(json.dumps(error), 80)}, not an object"
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return f"error.code is {shortened(json.dumps(code), 40)}, not an integer"
    for key in ("message", "status"):
        if not isinstance(error.get(key), str) or not error[key]:
            return f"error.{key} is {shortened(json.dumps(error.get(key)), 40)}, not a string"
    return None


def _error_shape(readings: Readings) -> Finding:
    reading: CompletionReading | None = readings.bad_request
    if reading is None:
        return Mark.NOT_TESTED, "the bad request was not sent"
    asked = "a request whose body is not JSON"
    if reading.failure is not None:
        return Mark.FAIL, f"{asked}: {reading.failure}"
    if not 400 <= reading.status < 500:
        return Mark.FAIL, f"{asked} got HTTP {reading.status}; the client's mistake is a 4xx (Google says 400 INVALID_ARGUMENT)"
    body = reading.body
    if not isinstance(body, dict) or "error" not in body:
        return Mark.FAIL, f"{asked} got HTTP {reading.status} without a Gemini error body: {shortened(json.dumps(body), 120)}"
    trouble = _error_object_trouble(body["error"])
    if trouble:
        return Mark.FAIL, f"{asked} got HTTP {reading.status}: {trouble}"
    error = body["error"]
    if error["code"] != reading.status:
        return Mark.FAIL, f"{asked} got HTTP {reading.status}, but error.code says {error['code']}"
    return (
        Mark.PASS,
        f"{asked}: HTTP {reading.status}, error {error['code']} {error['status']}: {shortened(error['message'], 80)}",
    )


def _error_frame(readings: Readings) -> Finding:
    seen = 0
    for name, reading in readings.streams.items():
        for position in reading.error_positions:
            seen += 1
            value = reading.events[position][1]
            where = f"stream {readings.label(name)}, chunk {position + 1}"
            if not isinstance(value, dict):
                return Mark.FAIL, f"{where}: an error that is not JSON: {shortened(str(value), 80)}"
            first = next(iter(value))
            if first != "error":
                return (
                    Mark.FAIL,
                    f"{where}: its first key is {first!r}, not 'error' (google-genai raises only on a chunk that starts so)",
                )
            trouble = _error_object_trouble(value["error"])
            if trouble:
                return Mark.FAIL, f"{where}: {trouble}"
            if not 400 <= value["error"]["code"] <= 599:
                return Mark.FAIL, f"{where}: error.code {value['error']['code']} is not in 400-599 (@google/genai ignores it)"
    if not seen:
        return Mark.NOT_TESTED, "no stream sent an error chunk (a server sends one only when it fails mid-stream)"
    return Mark.PASS, f'{seen} error chunks, each {{"error": {{"code", "message", "status"}}}} with a code in 400-599'


# -- whole bodies ----------------------------------------------------------------------------------


def _json_finish_reason(readings: Readings) -> Finding:
    judged = 0
    for name, reading in readings.completions.items():
        if _completion_problem(readings, name, reading):
            continue
        judged += 1
        chunk = gemini_chunk(reading.body) or {}
        candidate = gemini_first_candidate(chunk)
        if candidate is None:
            feedback = chunk.get("promptFeedback")
            if isinstance(feedback, dict) and feedback.get("blockReason"):
                continue
            return Mark.FAIL, f"JSON {readings.label(name)}: no candidate"
        if not _finished(candidate):
            return Mark.FAIL, f"JSON {readings.label(name)}: its candidate carries {_words(candidate.get('finishReason'))}"
    if not judged:
        return Mark.NOT_TESTED, f"no whole response answered (see {_JSON_NO_ERROR})"
    return Mark.PASS, f"{judged} responses, each candidate with a finishReason"


GEMINI_SUITE = ServerSuite(
    dialect=Dialect.GEMINI,
    path="/models/{model}:generateContent",
    stream_path="/models/{model}:streamGenerateContent?alt=sse",
    body=gemini_body,
    bad_request=GEMINI_BAD_REQUEST,
    requests=GEMINI_REQUESTS,
    checks=(
        ServerCheck(
            rule="streaming",
            check=_NO_ERROR,
            title="every stream comes whole: no error chunk, no transport failure (G4)",
            judge=_no_error,
            notes_retries=True,
        ),
        ServerCheck(
            rule="streaming",
            check=_FINISH,
            title="the last candidate chunk carries a finishReason (G1-G3)",
            judge=_finish_reason,
        ),
        ServerCheck(
            rule="finish reasons",
            check="gemini-reason-stop",
            title="a natural stop ends with STOP",
            judge=_reason("stop", "STOP"),
        ),
        ServerCheck(
            rule="finish reasons",
            check="gemini-reason-max-tokens",
            title="a maxOutputTokens truncation ends with MAX_TOKENS",
            judge=_reason("length", "MAX_TOKENS"),
        ),
        ServerCheck(
            rule="finish reasons",
            check="gemini-reason-tool-call",
            title="a forced function call ends with STOP and a JSON call",
            judge=tool_call_check(
                "tool_call",
                "STOP",
                limit="MAX_TOKENS",
                shape=_call_shape,
                # STOP is also a natural stop's: prose ending STOP is no call, not a wrong reason.
                reason_names_a_call=False,
                stream_problem=_stream_problem,
                completion_problem=_completion_problem,
                see=f"{_FINISH}, {_JSON_FINISH}",
                reason_words="finishReason",
            ),
        ),
        ServerCheck(
            rule="errors",
            check="gemini-error-shape",
            title='a bad request gets {"error": {"code", "message", "status"}}, code = the HTTP status',
            judge=_error_shape,
            reads_streams=False,
        ),
        ServerCheck(
            rule="errors",
            check="gemini-error-frame",
            title="an error chunk mid-stream starts with error, code an integer in 400-599",
            judge=_error_frame,
        ),
        ServerCheck(
            rule="non-streaming",
            check=_JSON_NO_ERROR,
            title="every whole answer is a GenerateContentResponse, not an error",
            judge=json_no_error(answer="a GenerateContentResponse", noun="responses"),
            reads_streams=False,
            notes_retries=True,
        ),
        ServerCheck(
            rule="non-streaming",
            check=_JSON_FINISH,
            title="every whole answer's candidate has a finishReason (G6 passes it as it is)",
            judge=_json_finish_reason,
            reads_streams=False,
        ),
        ServerCheck(
            rule="non-streaming",
            check="gemini-stream-json-agree",
            title="streamed and whole answers agree on reason and text",
            judge=stream_json_agree(
                stream_problem=_stream_problem, completion_problem=_completion_problem, see=f"{_NO_ERROR}, {_JSON_NO_ERROR}"
            ),
        ),
    ),
    # Google's key header; gateways that speak Gemini accept it (the bearer token goes too).
    api_key_header="x-goog-api-key",
    not_run={
        "stream-null-not-empty": 'Gemini omits finishReason until the last chunk: a "" there fails gemini-finish-reason',
        "stream-done-last": "Gemini has no terminator: a stream ends with its body, after the finishReason chunk",
        "stream-usage-after-finish": "Gemini has no include_usage: usageMetadata rides on every chunk",
        "n-choices": "Gemini's candidateCount is not asked: most Gemini models refuse more than one candidate",
    },
)
