"""The Google Gemini rules G1-G7 (docs/repair-rules.md, "Google Gemini"), one test per rule, on the
wire in both stream forms (SSE and the JSON array) and the Code Assist wrapping; every stream fed
whole, byte by byte and at random splits."""

from __future__ import annotations

import json

import pytest

from finishline import (
    Correction,
    Dialect,
    EventFramer,
    OnCut,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    Verdict,
    gemini_request_facts,
    repair_gemini_body,
    stream_dialect,
    transcribe_stream,
)
from tests.feeding import CHUNKINGS, chunk, run, split, sse
from tests.gemini_streams import (
    MODEL,
    array_body,
    array_elements,
    code_assist,
    gemini_chunk,
    gemini_chunks,
    gemini_error,
    sse_body,
)

GEMINI = Dialect.GEMINI
FORMS = ("sse", "array")
LIMITED = RepairPolicy(limit_reasons=True)


def body_of(form: str, chunks: list[dict], *, closed: bool = True) -> bytes:
    return sse_body(chunks) if form == "sse" else array_body(chunks, closed=closed)


def feed(upstream: bytes, chunking: str, **kwargs) -> tuple[bytes, StreamRepair]:
    return run(upstream, chunking, dialect=GEMINI, **kwargs)


def frames_of(body: bytes) -> list[dict]:
    """Each complete SSE frame's data, parsed, as google-genai reads them (`data: ` lines)."""
    return [json.loads(event.data) for event in EventFramer().receive_data(body) if event.data is not None]


def assert_one_error_frame_appended(upstream: bytes, out: bytes) -> dict:
    """G2's frame: after the upstream's bytes exactly one `data: ` line and a blank line, no
    `event:` line, `error` its first key, a numeric code in 400-599 and a Google status word."""
    assert out.startswith(upstream)
    frame = out[len(upstream) :]
    assert frame.startswith(b"data: {") and frame.endswith(b"}\n\n") and frame.count(b"\n") == 2, frame
    error = json.loads(frame[len(b"data: ") :])
    assert list(error) == ["error"] and list(error["error"]) == ["code", "message", "status"]
    assert isinstance(error["error"]["code"], int) and 400 <= error["error"]["code"] <= 599
    assert error["error"]["status"] == "UNAVAILABLE"
    assert b'"finishReason"' not in frame  # never a made-up finish reason (its message names none)
    return error["error"]


def assert_array_ends_in_error(upstream_chunks: list[dict], out: bytes) -> dict:
    """The array form's G2: the body is one valid JSON array, the upstream's whole elements as they
    were, then one error element."""
    elements = json.loads(out)
    assert elements[:-1] == upstream_chunks
    error = elements[-1]
    assert list(error) == ["error"] and error["error"]["code"] == 503 and error["error"]["status"] == "UNAVAILABLE"
    return error["error"]


# -- G1 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("finish", ["STOP", "MAX_TOKENS", "SAFETY", "MALFORMED_FUNCTION_CALL"])
def test_g1_a_stream_whose_last_chunk_has_a_finish_reason_passes_byte_for_byte(chunking, form, finish):
    upstream = body_of(form, gemini_chunks(["Hel", "lo", "!"], finish=finish))
    out, repair = feed(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.CLEAN
    assert repair.report.finish_reasons == [finish]
    assert repair.report.events == 3 and repair.report.dialect is GEMINI
    assert repair.report.usage is not None and repair.report.usage.output_tokens == 3


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_g1_vertex_crlf_frames_and_a_finish_only_last_chunk_pass(chunking, ending):
    # Vertex ends frames with CRLF CRLF and may end on an empty text part with the reason.
    chunks = [gemini_chunk("Hi", tokens=1), gemini_chunk("", finish="STOP", tokens=1)]
    chunks[1]["candidates"][0]["content"]["parts"][0]["thoughtSignature"] = "c2ln"
    upstream = sse_body(chunks, ending=ending)
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
def test_g1_a_blocked_prompt_without_candidates_is_complete(chunking, form):
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 4}, "modelVersion": MODEL}
    upstream = body_of(form, [blocked])
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g1_every_candidate_must_finish(chunking):
    both = {
        "candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}, {"content": {"parts": [{"text": "b"}]}, "index": 1}]
    }
    first = {"candidates": [{"content": {"parts": [{"text": "!"}]}, "finishReason": "STOP", "index": 0}]}
    second = {"candidates": [{"content": {"parts": []}, "finishReason": "STOP", "index": 1}]}
    finished = sse_body([both, first, second])
    out, repair = feed(finished, chunking)
    assert out == finished and repair.report.finish_reasons == ["STOP", "STOP"]
    unfinished = sse_body([both, first])
    out, repair = feed(unfinished, chunking)
    assert_one_error_frame_appended(unfinished, out)
    assert repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g1_the_code_assist_form_passes(chunking):
    upstream = sse_body([code_assist(chunk) for chunk in gemini_chunks(["Hel", "lo"])])
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN
    assert repair.report.finish_reasons == ["STOP"] and repair.report.model == MODEL


# -- G2 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_g2_a_stream_without_a_finish_reason_gets_one_error_frame(chunking, end):
    upstream = sse_body(gemini_chunks(["Hel", "lo"], finish=None))
    out, repair = feed(upstream, chunking, end=end)
    error = assert_one_error_frame_appended(upstream, out)
    assert "without a finishReason" in error["message"] and "(finish_fix)" in error["message"]
    report = repair.report
    assert report.verdict is Verdict.INTERRUPTED and report.finish_reasons == []
    assert report.interruption is not None and not report.interruption.before_first_token
    assert report.injected == [{"kind": "error_event", "type": "UNAVAILABLE"}]
    assert "clean end without a finishReason" in report.detail or end == "failure"


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_a_frame_cut_in_half_is_dropped_before_the_error(chunking):
    whole = sse_body(gemini_chunks(["Hel"], finish=None))
    half = sse_body([gemini_chunk("lo", tokens=2)])[:30]
    out, repair = feed(whole + half, chunking)
    assert_one_error_frame_appended(whole, out)
    assert repair.report.dropped_incomplete_bytes == 30


@pytest.mark.parametrize("form", FORMS)
def test_g2_zero_chunks_get_the_same_error(form):
    out, repair = run(b"", dialect=GEMINI, request=RequestFacts(stream=True, json_array_stream=form == "array"))
    if form == "sse":
        assert_one_error_frame_appended(b"", out)
    else:
        assert_array_ends_in_error([], out)
    assert repair.report.verdict is Verdict.INTERRUPTED and repair.report.interruption.before_first_token


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("whitespace", [b"\n", b"\r\n\r\n", b"  ", b" \n\t"])
def test_g2_a_body_of_whitespace_alone_gets_the_same_error(chunking, whitespace):
    # Neither form showed itself: SSE, whose blank lines are no chunk (the fuzz contracts found a
    # body of one LF, which the framer refused with an assertion); the frame in the line ending
    # the stream showed.
    out, repair = feed(whitespace, chunking)
    assert (b"\r\n" in out) == (b"\r\n" in whitespace)
    assert_one_error_frame_appended(b"", out.replace(b"\r\n", b"\n"))
    assert repair.report.verdict is Verdict.INTERRUPTED and repair.report.events == 0


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_g2_a_cut_array_is_closed_with_an_error_element(chunking, end):
    chunks = gemini_chunks(["Hel", "lo"], finish=None)
    upstream = array_body(chunks, closed=False)
    out, repair = feed(upstream, chunking, end=end)
    assert out.startswith(upstream)
    assert_array_ends_in_error(chunks, out)
    assert repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_an_array_cut_inside_an_element_drops_the_half_and_stays_json(chunking):
    chunks = gemini_chunks(["Hel", "lo"], finish=None)
    pieces = array_elements([*chunks, gemini_chunk('a "quoted" {brace}', tokens=3)], closed=False)
    upstream = b"".join(pieces[:2]) + pieces[2][:40]
    out, repair = feed(upstream, chunking)
    assert_array_ends_in_error(chunks, out)
    assert repair.report.dropped_incomplete_bytes == 40


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_an_array_closed_before_it_finished_gets_the_error_before_its_bracket(chunking):
    chunks = gemini_chunks(["Hel", "lo"], finish=None)
    upstream = array_body(chunks) + b"\r\n"
    out, repair = feed(upstream, chunking)
    assert out.endswith(b"]\r\n")
    assert_array_ends_in_error(chunks, out)
    assert repair.report.events == 2


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_an_empty_array_gets_the_error_inside_it(chunking):
    out, _ = feed(b"[]", chunking)
    assert_array_ends_in_error([], out)


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_a_finished_array_that_lost_its_bracket_gets_it(chunking):
    chunks = gemini_chunks(["Hel", "lo"])
    upstream = array_body(chunks, closed=False)
    out, repair = feed(upstream, chunking)
    assert out == upstream + b"]" and json.loads(out) == chunks
    assert repair.report.verdict is Verdict.REPAIRED and "terminator lost: appended ]" in repair.report.detail


@pytest.mark.parametrize("on_cut", [OnCut.ERROR, OnCut.STOP])
def test_g2_never_a_made_up_finish_reason_even_with_on_cut_stop(on_cut):
    upstream = sse_body(gemini_chunks(["Hel"], finish=None))
    out, repair = run(upstream, dialect=GEMINI, policy=RepairPolicy(on_cut=on_cut))
    assert_one_error_frame_appended(upstream, out)
    assert repair.report.verdict is Verdict.INTERRUPTED


def test_g2_on_cut_pass_changes_nothing():
    upstream = sse_body(gemini_chunks(["Hel"], finish=None))
    out, repair = run(upstream, dialect=GEMINI, policy=RepairPolicy(on_cut=OnCut.PASS))
    assert out == upstream and repair.report.verdict is Verdict.INTERRUPTED


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_g2_the_code_assist_form_is_cut_too(chunking):
    upstream = sse_body([code_assist(chunk) for chunk in gemini_chunks(["Hel"], finish=None)])
    out, _ = feed(upstream, chunking)
    assert_one_error_frame_appended(upstream, out)


# -- G3 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("finish", ["", "FINISH_REASON_UNSPECIFIED"])
def test_g3_an_empty_or_unspecified_reason_counts_as_none(chunking, form, finish):
    chunks = gemini_chunks(["Hel", "lo"], finish=finish)
    out, repair = feed(body_of(form, chunks), chunking)
    if form == "sse":
        assert_one_error_frame_appended(sse_body(chunks), out)
    else:
        assert_array_ends_in_error(chunks, out)
    assert repair.report.verdict is Verdict.INTERRUPTED and repair.report.finish_reasons == []


# -- G4 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("end", ["clean", "failure"])
def test_g4_an_upstream_error_passes_and_nothing_follows(chunking, form, end):
    upstream = body_of(
        form, [*gemini_chunks(["Hel"], finish=None), gemini_error(500, "An internal error has occurred.", "INTERNAL")]
    )
    out, repair = feed(upstream, chunking, end=end)
    assert out == upstream
    report = repair.report
    assert report.verdict is Verdict.UPSTREAM_ERROR and report.detail == "upstream_error: error event (INTERNAL)"
    assert report.upstream_error_message == "An internal error has occurred." and report.injected == []


# -- G5 ------------------------------------------------------------------------------------------


def test_g5_a_stall_after_tokens_ends_with_the_error_frame():
    upstream = sse_body(gemini_chunks(["Hel"], finish=None))
    repair = StreamRepair(dialect=GEMINI, policy=RepairPolicy(idle_timeout=2), started_at=0.0)
    out = repair.receive_data(upstream, now=0.5)
    assert repair.receive_timer(1.0) is None
    assert repair.next_stall_check(1.0) == 2.5
    ending = repair.receive_timer(2.5)
    assert ending is not None and ending.end_response
    error = assert_one_error_frame_appended(upstream, out + ending.client_bytes)
    assert "stalled" in error["message"]
    assert repair.report.verdict is Verdict.INTERRUPTED and repair.report.interruption.cause == "stalled"


def test_g5_the_first_token_deadline_counts_chunks_without_text_as_no_token():
    empty = sse_body([gemini_chunk(None, tokens=0)])
    repair = StreamRepair(dialect=GEMINI, policy=RepairPolicy(first_token_timeout=3, idle_timeout=0), started_at=0.0)
    out = repair.receive_data(empty, now=1.0)
    assert repair.receive_timer(2.0) is None
    ending = repair.receive_timer(3.0)
    assert ending is not None
    assert_one_error_frame_appended(empty, out + ending.client_bytes)
    assert repair.report.interruption.before_first_token


def test_g5_a_function_call_is_a_token():
    call = sse_body([gemini_chunk(None, function_call={"name": "get_weather", "args": {"city": "Paris"}})])
    repair = StreamRepair(dialect=GEMINI, policy=RepairPolicy(first_token_timeout=3, idle_timeout=0), started_at=0.0)
    repair.receive_data(call, now=1.0)
    assert repair.receive_timer(3.0) is None and repair.report.time_to_first_token == 1.0


# -- G6 ------------------------------------------------------------------------------------------


def test_g6_a_valid_whole_body_passes_with_its_reasons():
    body = json.dumps(gemini_chunk("Hello", tokens=2)).encode()  # no finishReason: passed as it is
    result = repair_gemini_body(body, status=200, limit_reasons=True, max_tokens=None, expected_length=len(body))
    assert (result.status, result.body, result.verdict) == (200, body, Verdict.CLEAN)


@pytest.mark.parametrize("how", ["not json", "short"])
def test_g6_a_cut_whole_body_becomes_a_5xx_with_a_gemini_error_whose_code_is_the_status(how):
    body = json.dumps(gemini_chunk("Hello", finish="STOP"), indent=2).encode()
    cut, expected = (body[:50], None) if how == "not json" else (body, len(body) + 10)
    result = repair_gemini_body(cut, status=200, limit_reasons=True, max_tokens=None, expected_length=expected)
    assert 500 <= result.status <= 599 and result.verdict is Verdict.INTERRUPTED
    error = json.loads(result.body)
    assert list(error) == ["error"] and error["error"]["code"] == result.status and error["error"]["status"] == "UNAVAILABLE"
    assert "answered HTTP 503" in result.detail


def test_g6_an_error_status_passes():
    body = json.dumps(gemini_error(429, "Quota", "RESOURCE_EXHAUSTED")).encode()
    result = repair_gemini_body(body, status=429, limit_reasons=True, max_tokens=None)
    assert (result.status, result.body, result.verdict) == (429, body, Verdict.HTTP_ERROR)


# -- G7 ------------------------------------------------------------------------------------------


def test_g7_the_request_limit_is_read_from_generation_config():
    body = json.dumps({"contents": [], "generationConfig": {"maxOutputTokens": 8, "temperature": 0}}).encode()
    assert RequestFacts.from_body(body).max_tokens == 8
    assert RequestFacts.from_body(b'{"generationConfig": {"maxOutputTokens": true}}').max_tokens is None


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
def test_g7_stop_at_the_limit_is_sent_as_max_tokens(chunking, form):
    chunks = gemini_chunks(["a", "b", "c"])
    out, repair = feed(body_of(form, chunks), chunking, request=RequestFacts(max_tokens=3), policy=LIMITED)
    sent = frames_of(out) if form == "sse" else json.loads(out)
    assert sent[:-1] == chunks[:-1]
    assert sent[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    sent[-1]["candidates"][0]["finishReason"] = "STOP"
    assert sent[-1] == chunks[-1]  # nothing else changed
    report = repair.report
    assert report.verdict is Verdict.REPAIRED and report.finish_reasons == ["MAX_TOKENS"]
    assert report.corrections == {Correction.LIMIT_REASON: 1}
    assert report.repairs == ["limit reason (G7): 'STOP' at 3 output tokens of the request's 3 sent as 'MAX_TOKENS'"]


@pytest.mark.parametrize(
    ("limit", "policy"), [(4, LIMITED), (None, LIMITED), (3, RepairPolicy(limit_reasons=False))], ids=["below", "none", "off"]
)
def test_g7_below_the_limit_without_one_or_switched_off_nothing_changes(limit, policy):
    upstream = sse_body(gemini_chunks(["a", "b", "c"]))
    out, repair = run(upstream, dialect=GEMINI, request=RequestFacts(max_tokens=limit), policy=policy)
    assert out == upstream and repair.report.verdict is Verdict.CLEAN


def test_g7_a_whole_body_at_the_limit_says_max_tokens():
    body = json.dumps(gemini_chunk("abc", finish="STOP", tokens=3), indent=2).encode()
    result = repair_gemini_body(body, status=200, limit_reasons=True, max_tokens=3)
    assert result.verdict is Verdict.REPAIRED and result.corrections == (Correction.LIMIT_REASON,)
    assert json.loads(result.body)["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert result.body == body.replace(b'"STOP"', b'"MAX_TOKENS"')  # edited in place


# -- the rest: the path, other dialects, bad bytes, the view ---------------------------------------


@pytest.mark.parametrize(
    ("path", "query", "stream", "array", "model"),
    [
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", "alt=sse", True, False, "gemini-2.5-flash"),
        ("/v1/models/gemini-2.5-flash:streamGenerateContent", "", True, True, "gemini-2.5-flash"),
        (
            "/v1beta1/projects/p/locations/us/publishers/google/models/gemini-2.5-pro:generateContent",
            "",
            False,
            False,
            "gemini-2.5-pro",
        ),
        ("/v1internal:streamGenerateContent", "alt=sse", True, False, None),
    ],
)
def test_the_path_says_whether_and_how_a_gemini_request_streams(path, query, stream, array, model):
    facts = gemini_request_facts(RequestFacts(), path, query)
    assert (facts.stream, facts.json_array_stream, facts.model) == (stream, array, model)


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_a_chat_stream_on_a_gemini_path_passes_untouched(chunking):
    upstream = sse(chunk("Hi"))
    out, repair = feed(upstream, chunking)
    assert out == upstream and repair.report.verdict is Verdict.SKIPPED
    assert "not Gemini as the path says" in repair.report.detail


def test_a_gemini_stream_on_a_chat_path_passes_untouched():
    upstream = sse_body(gemini_chunks(["Hi"], finish=None))
    out, repair = run(upstream, dialect=Dialect.CHAT)
    assert out == upstream and repair.report.verdict is Verdict.SKIPPED


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("form", FORMS)
def test_a_chunk_that_is_not_json_passes_and_is_booked_malformed(chunking, form):
    chunks = gemini_chunks(["Hel", "lo"])
    if form == "sse":
        upstream = sse_body(chunks[:1]) + b"data: {not json\n\n" + sse_body(chunks[1:])
    else:
        upstream = array_body(chunks[:1], closed=False) + b",\r\n{not: json}" + array_body(chunks[1:])[1:].replace(b"{", b",{", 1)
    out, repair = feed(upstream, chunking)
    assert out == upstream
    assert repair.report.verdict is Verdict.MALFORMED and repair.report.first_malformed_event == 2


@pytest.mark.parametrize("seed", range(20))
def test_the_array_framer_gives_back_every_byte_at_any_split(seed):
    upstream = array_body(gemini_chunks(['a "q" \\ {x}', "[y]", "z"])) + b"  trailing"
    repair = StreamRepair(dialect=GEMINI, policy=RepairPolicy(on_cut=OnCut.PASS))
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, "random", seed)) + repair.receive_end()
    assert out == upstream and repair.report.events == 3


@pytest.mark.parametrize("form", FORMS)
def test_the_view_reassembles_the_answer_per_candidate(form):
    body = body_of(form, gemini_chunks(["Hel", "lo"]))
    assert stream_dialect(body) is GEMINI
    transcript = transcribe_stream(body, GEMINI)
    assert transcript.endswith("--- candidate 0: finishReason='STOP'\nHello")
