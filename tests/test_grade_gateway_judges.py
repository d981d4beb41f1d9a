"""Each gateway check's judge, on made-up runs: every mark it can give, and the evidence it gives
with it. The runs are what `labs.grade.gateway_grader` builds from real requests: each client's
outcome, the bytes the gateway sent (read by the core), and which worker saw each request."""

from __future__ import annotations

import gzip
import json

import pytest

from finishline import Dialect
from labs.grade.card import Mark
from labs.grade.gateway_checks import GATEWAY_CHECKS, CheckRun, RequestResult, judge_run
from labs.grade.reading import read_stream
from labs.outcome import Outcome
from tests.gemini_streams import gemini_chunk, gemini_chunks, gemini_error, sse_body

JUDGES = {c.check: c.judge for c in GATEWAY_CHECKS}
ON_PRIMARY = {"primary": 1}


def chunk(delta: dict, reason: str | None = None) -> bytes:
    body = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


TOKENS = chunk({"role": "assistant", "content": ""}) + chunk({"content": "The"}) + chunk({"content": " quick"})


def sse_error(message: str) -> bytes:
    return b"data: " + json.dumps({"error": {"message": message, "code": "stream_interrupted"}}).encode() + b"\n\n"


ERROR = sse_error("stream was interrupted")
DONE = b"data: [DONE]\n\n"


def bytes_result(
    body: bytes, *, ending: str = "end", status: int = 200, workers=ON_PRIMARY, outcome=Outcome.ERROR
) -> RequestResult:
    return RequestResult(
        client="bytes",
        request_id="c0001",
        outcome=outcome,
        why="w",
        reading=read_stream(body, status=status, ending=ending),
        workers=dict(workers),
    )


def client(outcome: Outcome, workers=ON_PRIMARY, why: str = "APIError: stream was interrupted") -> RequestResult:
    return RequestResult(client="openai-python", request_id="c0002", outcome=outcome, why=why, workers=dict(workers))


def run(*results: RequestResult, spare: bool = False) -> CheckRun:
    return CheckRun(results=list(results), spare=spare)


# -- rule 2 ----------------------------------------------------------------------------------------

rule_2 = JUDGES["cut-after-tokens-fin"]


def test_rule_2_passes_on_an_error_event_that_every_client_reports():
    mark, evidence = rule_2(run(bytes_result(TOKENS + ERROR), client(Outcome.ERROR)))
    assert (mark, evidence) == (Mark.PASS, "error event: stream was interrupted; every client raised or flagged")


@pytest.mark.parametrize(
    ("body", "ending", "status", "evidence"),
    [
        (TOKENS + chunk({}, "stop") + DONE, "end", 200, "the gateway made up finish_reason 'stop' and [DONE] for a cut stream"),
        (TOKENS, "end", 200, "the stream just stopped: 3 events, then a clean end, no error event"),
        (TOKENS + DONE, "end", 200, "the stream just stopped: 4 events with [DONE], then a clean end, no error event"),
        (TOKENS, "transport error: reset", 200, "the stream just stopped: 3 events, then transport error: reset, no error event"),
        (
            TOKENS + ERROR + DONE,
            "end",
            200,
            "an error event, then [DONE] after it (clients that stop at [DONE] call that a success)",
        ),
        (b"<html>502</html>", "end", 502, "the gateway answered HTTP 502 instead of streaming the tokens the worker had sent"),
    ],
)
def test_rule_2_fails_on_anything_but_an_explicit_error(body, ending, status, evidence):
    assert rule_2(run(bytes_result(body, ending=ending, status=status), client(Outcome.ERROR))) == (Mark.FAIL, evidence)


def test_rule_2_fails_when_a_client_calls_the_error_event_a_success():
    mark, evidence = rule_2(
        run(bytes_result(TOKENS + ERROR), client(Outcome.SILENT_TRUNCATION, why="success reported with 9 characters"))
    )
    assert (mark, evidence) == (Mark.FAIL, "openai-python: silent-truncation (success reported with 9 characters)")


def test_rule_2_does_not_judge_requests_the_faulty_worker_never_saw():
    assert (
        rule_2(run(bytes_result(TOKENS + chunk({}, "stop") + DONE, workers={"spare": 1}), client(Outcome.OK)))[0]
        is Mark.NOT_TESTED
    )
    mark, evidence = rule_2(run(bytes_result(TOKENS + ERROR), client(Outcome.OK, workers={"spare": 1})))
    assert mark is Mark.PASS and evidence.endswith("(openai-python went to the spare, not judged)")


# -- rule 1 ----------------------------------------------------------------------------------------

rule_1 = JUDGES["prefill-cut-fin"]
RETRIED = {"primary": 1, "spare": 1}


def test_rule_1_passes_when_the_spare_served_every_cut_request():
    mark, evidence = rule_1(run(client(Outcome.OK, workers=RETRIED, why="full answer"), spare=True))
    assert (mark, evidence) == (Mark.PASS, "1 requests cut before the first token got the full answer from the spare")


def test_rule_1_fails_when_the_client_gets_the_cut_and_names_who_never_retried():
    mark, evidence = rule_1(run(client(Outcome.ERROR), spare=True))
    assert (mark, evidence) == (
        Mark.FAIL,
        "openai-python: error (APIError: stream was interrupted); the gateway never asked the spare",
    )


def test_rule_1_is_not_tested_without_a_spare_or_when_every_request_went_to_the_spare_first():
    assert rule_1(run(client(Outcome.ERROR)))[0] is Mark.NOT_TESTED
    mark, evidence = rule_1(run(client(Outcome.OK, workers={"spare": 1}), spare=True))
    assert (mark, evidence) == (
        Mark.NOT_TESTED,
        "no request reached the faulty worker (the gateway sent them to the spare first: openai-python)",
    )


# -- stalls and finish reasons ---------------------------------------------------------------------

stall = JUDGES["stall-after-tokens"]


def test_stall_passes_on_an_error_in_time_and_fails_on_a_hang():
    assert stall(run(bytes_result(TOKENS + ERROR), client(Outcome.ERROR)))[0] is Mark.PASS
    mark, evidence = stall(
        run(bytes_result(TOKENS, ending="timeout: no end within 15 s", outcome=Outcome.HANG), client(Outcome.HANG, why="no end"))
    )
    assert (mark, evidence) == (
        Mark.FAIL,
        "bytes: no end before the deadline (3 events, then silence); openai-python: hang (no end)",
    )


def test_stall_ignores_requests_the_spare_answered():
    mark, evidence = stall(run(bytes_result(TOKENS + ERROR), client(Outcome.OK, workers={"spare": 1})))
    assert mark is Mark.PASS and evidence.endswith("(openai-python went to the spare, not judged)")
    assert stall(run(client(Outcome.OK, workers={"spare": 1})))[0] is Mark.NOT_TESTED


def test_finish_reason_checks_say_whether_the_gateway_repaired_or_passed_the_defect_on():
    repaired = bytes_result(TOKENS + chunk({}, "stop") + DONE, outcome=Outcome.OK)
    mark, evidence = JUDGES["reason-omitted"](run(repaired, client(Outcome.OK, why="full answer")))
    assert mark is Mark.PASS and evidence.endswith("the gateway repaired the defect (its stream is well-formed)")
    passed_on = bytes_result(TOKENS + DONE, outcome=Outcome.OK)
    mark, evidence = JUDGES["reason-omitted"](
        run(passed_on, client(Outcome.ERROR, why="PiStreamError(error): Stream ended without finish_reason"))
    )
    assert mark is Mark.FAIL
    assert evidence == (
        "openai-python: error (PiStreamError(error): Stream ended without finish_reason); the gateway passed the defect on "
        "(the core: repaired: injected finish_reason 'stop' for choice 0 before [DONE])"
    )


# -- a gateway that compresses its stream although the grader asked for identity --------------------

COMPRESSED = (
    "bytes: the body came gzip-compressed although the grader asked for accept-encoding: identity, so its events were not read"
)


def compressed_result(outcome=Outcome.ERROR) -> RequestResult:
    return RequestResult(
        client="bytes",
        request_id="c0001",
        outcome=outcome,
        why="compressed body",
        reading=read_stream(gzip.compress(TOKENS + ERROR), content_encoding="gzip"),
        workers=dict(ON_PRIMARY),
    )


@pytest.mark.parametrize("check", ["healthy", "cut-after-tokens-fin", "stall-after-tokens", "reason-omitted"])
def test_compressed_bytes_are_not_judged_so_a_pass_is_not_tested(check):
    told = Outcome.OK if check in ("healthy", "reason-omitted") else Outcome.ERROR
    by_check = next(c for c in GATEWAY_CHECKS if c.check == check)
    assert judge_run(by_check, run(compressed_result(), client(told, why="full answer"))) == (Mark.NOT_TESTED, COMPRESSED)


def test_compressed_bytes_do_not_hide_a_client_that_fails():
    by_check = next(c for c in GATEWAY_CHECKS if c.check == "cut-after-tokens-fin")
    mark, evidence = judge_run(by_check, run(compressed_result(), client(Outcome.SILENT_TRUNCATION, why="success reported")))
    assert (mark, evidence) == (Mark.FAIL, f"openai-python: silent-truncation (success reported); {COMPRESSED}")


def test_a_long_message_in_the_evidence_is_cut_with_a_mark():
    long = "stream was interrupted: " + "x" * 200
    mark, evidence = rule_2(run(bytes_result(TOKENS + sse_error(long)), client(Outcome.ERROR)))
    assert mark is Mark.PASS and evidence == f"error event: {long[:109]}…; every client raised or flagged"


# -- Gemini: no terminator, so a stream without its finishReason is judged as a cut ------------------


def _gemini_run(body: bytes, outcome: Outcome) -> CheckRun:
    raw = RequestResult(
        client="bytes",
        request_id="c0001",
        outcome=outcome,
        why="w",
        reading=read_stream(sse_body(gemini_chunks(["The", " quick"], finish=None)) + body, dialect=Dialect.GEMINI),
        workers=dict(ON_PRIMARY),
    )
    sdk = RequestResult(
        client="google-genai", request_id="c0002", outcome=outcome, why="ServerError: 503", workers=dict(ON_PRIMARY)
    )
    return CheckRun(results=[raw, sdk], spare=False, dialect=Dialect.GEMINI)


def test_no_finish_reason_passes_with_geminis_error_frame_and_fails_on_a_made_up_stop_or_silence():
    judge = JUDGES["no-finish-reason"]
    mark, evidence = judge(_gemini_run(sse_body([gemini_error(503, "the stream was cut (finish_fix)")]), Outcome.ERROR))
    assert (mark, evidence) == (Mark.PASS, "error event: the stream was cut (finish_fix); every client raised or flagged")
    made_up = sse_body([gemini_chunk("", finish="STOP", tokens=3)])
    mark, evidence = judge(_gemini_run(made_up, Outcome.OK))
    assert mark is Mark.FAIL and evidence.startswith("the gateway made up finishReason 'STOP' for a cut stream"), evidence
    mark, evidence = judge(_gemini_run(b"", Outcome.SILENT_TRUNCATION))
    assert mark is Mark.FAIL and evidence.startswith("the stream just stopped: 2 events, then a clean end, no error event")
