"""The Gemini server checks, each judged on answers read by the core (`labs.grade.reading`), no
server: a healthy set of answers passes every check (the mid-stream error frame is `not tested`:
none came), and each way a Gemini server can answer wrong fails the check named after it, in the
SSE form and in the JSON-array form alike. `tests/test_grade_server_gemini.py` grades the worker."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finishline import Dialect
from labs.grade.card import Mark
from labs.grade.reading import CLEAN_END, TRANSPORT_ERROR, read_completion, read_stream
from labs.grade.server_check import Readings
from labs.grade.server_checks_gemini import GEMINI_REQUESTS, GEMINI_SUITE, gemini_body
from tests.gemini_streams import array_body, gemini_chunk, gemini_chunks, gemini_error, sse_body

GEMINI = Dialect.GEMINI
CALL = {"name": "get_weather", "args": {"city": "Paris"}}
BAD_REQUEST = (400, gemini_error(400, "Invalid JSON payload received.", "INVALID_ARGUMENT"))


def _answer(name: str) -> list[dict[str, Any]]:
    """A healthy server's chunks for request `name`."""
    if name == "length":
        return gemini_chunks(["one", ", two"], finish="MAX_TOKENS")
    if name == "tool_call":
        return [gemini_chunk(None, finish="STOP", function_call=CALL)]
    return gemini_chunks(["The quick", " brown fox."])


def _whole(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole body that answers the same as `chunks`: their parts joined, the last reason."""
    parts = [part for chunk in chunks for part in chunk["candidates"][0]["content"]["parts"]]
    texts = "".join(part.get("text", "") for part in parts)
    merged = [{"text": texts}] if texts else []
    merged += [part for part in parts if "functionCall" in part]
    body = json.loads(json.dumps(chunks[-1]))
    body["candidates"][0]["content"]["parts"] = merged
    return body


def readings(
    *,
    streams: dict[str, bytes] | None = None,
    endings: dict[str, str] | None = None,
    completions: dict[str, tuple[int, Any]] | None = None,
    bad_request: tuple[int, Any] = BAD_REQUEST,
    array: bool = False,
) -> Readings:
    """The answers to every request: healthy ones, but for those given (bodies as sent; a
    completion as (status, JSON value or bytes))."""
    read_streams, read_completions = {}, {}
    for request in GEMINI_REQUESTS:
        name = request.name
        healthy = _answer(name)
        body = (streams or {}).get(name) or (array_body(healthy) if array else sse_body(healthy))
        sent = gemini_body(request, model="m", stream=True)
        read_streams[name] = read_stream(
            body,
            dialect=GEMINI,
            request=sent,
            ending=(endings or {}).get(name, CLEAN_END),
            content_type="application/json" if array else "text/event-stream",
        )
        status, value = (completions or {}).get(name) or (200, _whole(healthy))
        whole = value if isinstance(value, bytes) else json.dumps(value).encode()
        read_completions[name] = read_completion(whole, status=status, dialect=GEMINI, request=sent)
    status, value = bad_request
    refused = read_completion(value if isinstance(value, bytes) else json.dumps(value).encode(), status=status, dialect=GEMINI)
    return Readings(
        streams=read_streams, completions=read_completions, requests=GEMINI_REQUESTS, dialect=GEMINI, bad_request=refused
    )


def marks(answers: Readings) -> dict[str, Mark]:
    return {check.check: check.run(answers).mark for check in GEMINI_SUITE.checks}


def finding(answers: Readings, check: str) -> tuple[Mark, str]:
    row = next(c for c in GEMINI_SUITE.checks if c.check == check).run(answers)
    return row.mark, row.evidence


ALL = {check.check for check in GEMINI_SUITE.checks}


@pytest.mark.parametrize("array", [False, True], ids=["sse", "json-array"])
def test_a_healthy_server_passes_every_check_but_the_error_frame_none_came(array):
    answers = readings(array=array)
    expected = dict.fromkeys(ALL, Mark.PASS) | {"gemini-error-frame": Mark.NOT_TESTED}
    assert marks(answers) == expected, {c.check: c.run(answers).evidence for c in GEMINI_SUITE.checks}
    assert finding(answers, "gemini-reason-max-tokens") == (Mark.PASS, "maxOutputTokens=5: stream: MAX_TOKENS, JSON: MAX_TOKENS")
    assert finding(answers, "gemini-error-shape") == (
        Mark.PASS,
        "a request whose body is not JSON: HTTP 400, error 400 INVALID_ARGUMENT: Invalid JSON payload received.",
    )


@pytest.mark.parametrize("array", [False, True], ids=["sse", "json-array"])
@pytest.mark.parametrize(
    ("finish", "words"),
    [
        (None, "no finishReason"),
        ("", "finishReason ''"),
        ("FINISH_REASON_UNSPECIFIED", "finishReason 'FINISH_REASON_UNSPECIFIED'"),
    ],
    ids=["omitted", "empty", "unspecified"],
)
def test_a_stream_without_a_finish_reason_fails_gemini_finish_reason(array, finish, words):
    chunks = gemini_chunks(["The quick", " brown fox."], finish=finish)
    body = array_body(chunks) if array else sse_body(chunks)
    answers = readings(streams={"stop": body}, completions={"stop": (200, _whole(chunks))}, array=array)
    got = marks(answers)
    assert {check for check, mark in got.items() if mark is Mark.FAIL} == {"gemini-finish-reason", "gemini-json-finish-reason"}
    # The reason's value has nothing to judge on that request: not tested, naming the failing checks.
    mark, evidence = finding(answers, "gemini-reason-stop")
    assert mark is Mark.NOT_TESTED and "gemini-finish-reason" in evidence
    assert finding(answers, "gemini-finish-reason") == (
        Mark.FAIL,
        f"stream a natural stop: its last candidate chunk (2 of 2) carries {words}; the core: interrupted after the "
        "first token (clean end without a finishReason) after 2 events; sent an error event",
    )
    assert finding(answers, "gemini-json-finish-reason") == (Mark.FAIL, f"JSON a natural stop: its candidate carries {words}")


def test_a_reason_on_an_earlier_chunk_is_not_the_last_candidate_chunks():
    chunks = [*gemini_chunks(["The quick"]), gemini_chunk(" brown fox.", tokens=2)]
    mark, evidence = finding(readings(streams={"stop": sse_body(chunks)}), "gemini-finish-reason")
    assert (mark, evidence) == (
        Mark.FAIL,
        "stream a natural stop: its last candidate chunk (2 of 2) carries no finishReason (an earlier chunk had one)",
    )


def test_a_blocked_prompt_is_complete_without_a_finish_reason():
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 4}}
    answers = readings(streams={"stop": sse_body([blocked])}, completions={"stop": (200, blocked)})
    assert finding(answers, "gemini-finish-reason")[0] is Mark.PASS
    assert finding(answers, "gemini-json-finish-reason")[0] is Mark.PASS


@pytest.mark.parametrize("array", [False, True], ids=["sse", "json-array"])
def test_an_error_chunk_fails_gemini_no_error_and_its_shape_is_judged(array):
    chunks: list[dict[str, Any]] = [*gemini_chunks(["The quick"], finish=None), gemini_error(503, "The model is overloaded.")]
    answers = readings(streams={"stop": array_body(chunks) if array else sse_body(chunks)}, array=array)
    got = marks(answers)
    assert {check for check, mark in got.items() if mark is Mark.FAIL} == {"gemini-no-error"}
    assert finding(answers, "gemini-no-error") == (
        Mark.FAIL,
        "stream a natural stop sent an error chunk after 1 chunks: The model is overloaded.",
    )
    assert finding(answers, "gemini-error-frame") == (
        Mark.PASS,
        '1 error chunks, each {"error": {"code", "message", "status"}} with a code in 400-599',
    )
    # The stream with the error has no reason to judge: not tested, naming gemini-no-error.
    mark, evidence = finding(answers, "gemini-reason-stop")
    assert mark is Mark.NOT_TESTED and "gemini-no-error" in evidence


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        ({"error": {"code": "503", "message": "m", "status": "UNAVAILABLE"}}, 'error.code is "503", not an integer'),
        ({"error": {"code": 200, "message": "m", "status": "OK"}}, "error.code 200 is not in 400-599 (@google/genai ignores it)"),
        ({"error": {"code": 503, "message": "m"}}, "error.status is null, not a string"),
        ({"error": "overloaded"}, 'error is "overloaded", not an object'),
        (
            {"traceId": "x", "error": {"code": 503, "message": "m", "status": "UNAVAILABLE"}},
            "its first key is 'traceId', not 'error' (google-genai raises only on a chunk that starts so)",
        ),
    ],
    ids=["code-a-string", "code-200", "no-status", "not-an-object", "error-not-first"],
)
def test_an_error_frame_of_the_wrong_shape_fails_gemini_error_frame(frame, why):
    chunks: list[dict[str, Any]] = [*gemini_chunks(["The quick"], finish=None), frame]
    assert finding(readings(streams={"length": sse_body(chunks)}), "gemini-error-frame") == (
        Mark.FAIL,
        f"stream maxOutputTokens=5, chunk 2: {why}",
    )


def test_a_transport_failure_mid_stream_fails_gemini_no_error():
    answers = readings(
        streams={"stop": sse_body(gemini_chunks(["The quick"], finish=None))},
        endings={"stop": f"{TRANSPORT_ERROR}Connection reset by peer"},
    )
    mark, evidence = finding(answers, "gemini-no-error")
    assert mark is Mark.FAIL and evidence.startswith(
        "stream a natural stop: transport error: Connection reset by peer; the core: "
    )


@pytest.mark.parametrize(
    ("bad_request", "why"),
    [
        ((200, gemini_chunks(["Hi"])[0]), "a request whose body is not JSON got HTTP 200; the client's mistake is a 4xx"),
        ((500, gemini_error(500, "Internal", "INTERNAL")), "a request whose body is not JSON got HTTP 500; the client's mistake"),
        ((400, {"detail": "bad json"}), 'a request whose body is not JSON got HTTP 400 without a Gemini error body: {"detail"'),
        ((400, b"Bad Request"), "a request whose body is not JSON got HTTP 400 without a Gemini error body: null"),
        ((400, gemini_error(500, "m", "INTERNAL")), "a request whose body is not JSON got HTTP 400, but error.code says 500"),
        (
            (422, {"error": {"code": 422, "message": "m", "type": "invalid_request_error"}}),
            "a request whose body is not JSON got HTTP 422: error.status is null, not a string",
        ),
    ],
    ids=["200", "500", "not-gemini", "not-json", "code-not-status", "openai-shape"],
)
def test_a_bad_request_answered_wrong_fails_gemini_error_shape(bad_request, why):
    mark, evidence = finding(readings(bad_request=bad_request), "gemini-error-shape")
    assert mark is Mark.FAIL and evidence.startswith(why), evidence


def test_a_wrong_reason_fails_the_reason_checks():
    stopped = gemini_chunks(["one", ", two"], finish="STOP")
    answers = readings(streams={"length": sse_body(stopped)}, completions={"length": (200, _whole(stopped))})
    assert finding(answers, "gemini-reason-max-tokens") == (
        Mark.FAIL,
        "stream maxOutputTokens=5 ended with 'STOP', expected 'MAX_TOKENS'",
    )
    filtered = gemini_chunks(["The quick"], finish="SAFETY")
    answers = readings(streams={"stop": sse_body(filtered)}, completions={"stop": (200, _whole(filtered))})
    assert finding(answers, "gemini-reason-stop") == (Mark.FAIL, "stream a natural stop ended with 'SAFETY', expected 'STOP'")


def test_a_function_call_of_the_wrong_shape_or_reason_fails_the_tool_call_check():
    wrong = [gemini_chunk(None, finish="STOP", function_call={"name": "get_time", "args": {}})]
    answers = readings(streams={"tool_call": sse_body(wrong)}, completions={"tool_call": (200, _whole(wrong))})
    mark, evidence = finding(answers, "gemini-reason-tool-call")
    assert mark is Mark.FAIL and "'get_time', the only tool offered is 'get_weather'" in evidence
    odd = [gemini_chunk(None, finish="SAFETY", function_call=CALL)]
    answers = readings(streams={"tool_call": sse_body(odd)}, completions={"tool_call": (200, _whole(odd))})
    assert finding(answers, "gemini-reason-tool-call")[0] is Mark.FAIL
    # Prose ending STOP: the model made no call; not a protocol fault.
    prose = gemini_chunks(["It is sunny."])
    answers = readings(streams={"tool_call": sse_body(prose)}, completions={"tool_call": (200, _whole(prose))})
    assert finding(answers, "gemini-reason-tool-call")[0] is Mark.NOT_TESTED


def test_whole_answers_that_are_errors_or_disagree_fail_the_json_checks():
    answers = readings(completions={"stop": (200, gemini_error(503))})
    mark, evidence = finding(answers, "gemini-json-no-error")
    assert mark is Mark.FAIL and evidence.startswith("JSON a natural stop: status 200 with an error body: ")
    answers = readings(completions={"stop": (503, gemini_error(503))})
    assert finding(answers, "gemini-json-no-error") == (Mark.FAIL, "JSON a natural stop: HTTP 503")
    other = gemini_chunks(["A lazy dog."])
    answers = readings(completions={"stop": (200, _whole(other))})
    assert finding(answers, "gemini-stream-json-agree") == (
        Mark.FAIL,
        "a natural stop: choice 0 streamed 20 characters, JSON 11, and they differ",
    )
