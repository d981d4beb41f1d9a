"""finish_fix's Gemini rules end to end: a real mitmdump with `-s addons/finish_fix.py` in reverse
mode in front of the scripted upstream, raw bytes read with httpx, and finish_fix's ledger.

- G1: a stream whose last chunk has a finishReason comes out byte-identical, in both stream forms
  (SSE with `?alt=sse`, the JSON array without it, `application/json`), booked `clean`, dialect
  `gemini`, with the model the path names.
- G2: a stream cut without a finishReason (a clean close, a reset, an array cut inside an element)
  ends with finish_fix's one error frame (SSE) or error element (the array, which stays valid JSON).
- G4: an upstream error frame passes, nothing after it.
- G6: a whole `:generateContent` body passes when it is JSON; one that is not becomes HTTP 503 with
  Gemini's error body, whose `code` is the status.
- The Code Assist path (`/v1internal:streamGenerateContent`) is in scope by the default option.

No timed assertions: each case waits for its response and its ledger line.
"""

from __future__ import annotations

import json

import pytest

from faults.child_processes import START_DEADLINE_S
from finishline import Dialect
from labs.worker import WorkerSettings, response_plan
from tests.e2e_support import RawResponse, raw_post
from tests.fixtures_e2e import FinishFixProxy
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
from tests.upstream_server import Ending, Framing, Script

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3 * START_DEADLINE_S)]

STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent"
WHOLE_PATH = f"/v1beta/models/{MODEL}:generateContent"
REQUEST = {"contents": [{"role": "user", "parts": [{"text": "Say the sentence about the fox."}]}]}
CHUNKS = gemini_chunks(["The quick", " brown fox", " jumps."])
UNFINISHED = gemini_chunks(["The quick", " brown fox"], finish=None)


def sse_pieces(chunks: list[dict]) -> list[bytes]:
    return [sse_body([chunk]) for chunk in chunks]


def post(proxy: FinishFixProxy, prefix: str, path: str, query: str = "alt=sse") -> RawResponse:
    url = f"{proxy.mitmdump.url}{prefix}{path}" + (f"?{query}" if query else "")
    return raw_post(url, body=REQUEST, headers={"x-goog-api-key": "e2e-key"})


def ledger_line(proxy: FinishFixProxy, prefix: str) -> dict:
    (line,) = proxy.wait_ledger_lines(prefix)
    assert line["dialect"] == "gemini"
    return line


def test_g1_a_finished_sse_stream_passes_byte_for_byte(finish_fix: FinishFixProxy):
    prefix = finish_fix.upstream.route(Script(pieces=sse_pieces(CHUNKS)))
    response = post(finish_fix, prefix, STREAM_PATH)
    assert response.status == 200 and response.error is None
    assert response.body == sse_body(CHUNKS)
    line = ledger_line(finish_fix, prefix)
    assert line["verdict"] == "clean" and line["model"] == MODEL


def test_g1_a_finished_json_array_stream_passes_byte_for_byte(finish_fix: FinishFixProxy):
    prefix = finish_fix.upstream.route(Script(content_type="application/json; charset=UTF-8", pieces=array_elements(CHUNKS)))
    response = post(finish_fix, prefix, STREAM_PATH, query="")
    assert response.status == 200 and response.body == array_body(CHUNKS)
    assert json.loads(response.body) == CHUNKS
    assert ledger_line(finish_fix, prefix)["verdict"] == "clean"


@pytest.mark.parametrize("ending", [Ending.CLEAN, Ending.RST], ids=["clean-close", "reset"])
def test_g2_an_sse_stream_without_a_finish_reason_ends_in_one_error_frame(finish_fix: FinishFixProxy, ending):
    prefix = finish_fix.upstream.route(Script(pieces=sse_pieces(UNFINISHED), ending=ending, pause_before_end_s=0.2))
    response = post(finish_fix, prefix, STREAM_PATH)
    assert response.status == 200 and response.error is None  # the response ended well: the frame says the rest
    upstream = sse_body(UNFINISHED)
    assert response.body.startswith(upstream)
    frame = response.body[len(upstream) :]
    assert frame.startswith(b"data: {") and frame.endswith(b"}\n\n") and b"event:" not in frame
    error = json.loads(frame[len(b"data: ") :])
    assert list(error) == ["error"] and error["error"]["code"] == 503 and error["error"]["status"] == "UNAVAILABLE"
    line = ledger_line(finish_fix, prefix)
    assert line["verdict"] == "interrupted"
    assert line["injected"] == [{"kind": "error_event", "type": "UNAVAILABLE"}]


def test_g2_a_json_array_cut_inside_an_element_stays_valid_json(finish_fix: FinishFixProxy):
    pieces = array_elements([*UNFINISHED, gemini_chunk(" jumps.", tokens=3)], closed=False)
    script = Script(
        content_type="application/json; charset=UTF-8", pieces=pieces[:2], ending=Ending.FIN_MID_CHUNK, cut_tail=pieces[2][:25]
    )
    prefix = finish_fix.upstream.route(script)
    response = post(finish_fix, prefix, STREAM_PATH, query="")
    assert response.status == 200 and response.error is None
    elements = json.loads(response.body)
    assert elements[:2] == UNFINISHED and elements[2]["error"]["code"] == 503 and len(elements) == 3
    assert ledger_line(finish_fix, prefix)["verdict"] == "interrupted"


def test_g4_an_upstream_error_frame_passes_and_nothing_follows(finish_fix: FinishFixProxy):
    pieces = sse_pieces([*UNFINISHED, gemini_error(500, "An internal error has occurred.", "INTERNAL")])
    prefix = finish_fix.upstream.route(Script(pieces=pieces))
    response = post(finish_fix, prefix, STREAM_PATH)
    assert response.body == b"".join(pieces)
    assert ledger_line(finish_fix, prefix)["verdict"] == "upstream_error"


def test_the_code_assist_path_is_in_scope_and_its_frames_are_read(finish_fix: FinishFixProxy):
    wrapped = [code_assist(chunk) for chunk in UNFINISHED]
    prefix = finish_fix.upstream.route(Script(pieces=sse_pieces(wrapped)))
    response = post(finish_fix, prefix, "/v1internal:streamGenerateContent")
    assert response.body.startswith(sse_body(wrapped)) and b'"status":"UNAVAILABLE"' in response.body
    assert ledger_line(finish_fix, prefix)["verdict"] == "interrupted"


def test_g6_a_whole_json_body_passes(finish_fix: FinishFixProxy):
    body = json.dumps(gemini_chunk("The quick brown fox jumps.", finish="STOP", tokens=6), indent=2).encode()
    prefix = finish_fix.upstream.route(Script(content_type="application/json", pieces=[body], framing=Framing.CONTENT_LENGTH))
    response = post(finish_fix, prefix, WHOLE_PATH, query="")
    assert (response.status, response.body) == (200, body)
    assert ledger_line(finish_fix, prefix)["verdict"] == "clean"


def test_g6_a_cut_whole_body_becomes_a_503_with_a_gemini_error(finish_fix: FinishFixProxy):
    body = json.dumps(gemini_chunk("The quick brown fox jumps.", finish="STOP", tokens=6), indent=2).encode()
    # Cut, yet whole by its framing (a close-delimited body that ended early): not JSON.
    script = Script(content_type="application/json", pieces=[body[:60]], framing=Framing.CLOSE_DELIMITED)
    prefix = finish_fix.upstream.route(script)
    response = post(finish_fix, prefix, WHOLE_PATH, query="")
    assert response.status == 503
    error = json.loads(response.body)
    assert list(error) == ["error"] and error["error"]["code"] == 503 and error["error"]["status"] == "UNAVAILABLE"
    line = ledger_line(finish_fix, prefix)
    assert line["verdict"] == "interrupted" and "answered HTTP 503" in line["detail"]


@pytest.mark.parametrize("ending", [Ending.SHORT_CONTENT_LENGTH, Ending.RST], ids=["short-content-length", "reset"])
def test_g6_a_whole_body_shorter_than_its_length_becomes_a_503_not_mitmproxys_502(finish_fix: FinishFixProxy, ending):
    body = json.dumps(gemini_chunk("The quick brown fox jumps.", finish="STOP", tokens=6), indent=2).encode()
    script = Script(
        content_type="application/json", pieces=[body[:60]], framing=Framing.CONTENT_LENGTH, ending=ending, pause_before_end_s=0.2
    )
    prefix = finish_fix.upstream.route(script)
    response = post(finish_fix, prefix, WHOLE_PATH, query="")
    assert response.status == 503, response.body
    error = json.loads(response.body)
    assert list(error) == ["error"] and error["error"]["code"] == 503 and error["error"]["status"] == "UNAVAILABLE"
    line = ledger_line(finish_fix, prefix)
    assert line["verdict"] == "interrupted" and line["detail"].startswith("interrupted: whole body cut (60 ")


@pytest.mark.parametrize("query", ["alt=sse", ""], ids=["sse", "array"])
def test_the_lab_workers_healthy_gemini_stream_passes_byte_for_byte(finish_fix: FinishFixProxy, query):
    """The simulated worker's stream (labs/worker, both forms, a thought and a call) is healthy to
    finish_fix's Gemini rules: it passes untouched and is booked `clean`."""
    settings = WorkerSettings(tokens=3, reasoning_tokens=1, tool_calls=1).for_request({"model": MODEL}, Dialect.GEMINI)
    plan = response_plan(settings, dialect=Dialect.GEMINI, json_array=not query)
    content_type = "application/json" if not query else "text/event-stream"
    prefix = finish_fix.upstream.route(Script(content_type=content_type, pieces=[segment.event for segment in plan.segments]))
    response = post(finish_fix, prefix, STREAM_PATH, query=query)
    assert response.status == 200 and response.error is None
    assert response.body == b"".join(segment.event for segment in plan.segments)
    assert ledger_line(finish_fix, prefix)["verdict"] == "clean"
