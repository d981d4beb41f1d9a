"""`python -m labs.grade server --dialect gemini`: what the grader asks (Gemini's paths, bodies and
key header), and its card on a server that answers as scripted. Each check's failures are pinned
on answers alone in `tests/test_grade_server_gemini_checks.py`; the lab's worker is graded in
`tests/test_grade_server_gemini_worker.py`."""

from __future__ import annotations

import json

import pytest

from finishline import Dialect
from labs.grade.card import EXIT_CANNOT_RUN, GradeError, Mark
from labs.grade.cli import main
from labs.grade.server_checks_gemini import GEMINI_BAD_REQUEST
from labs.grade.server_grader import grade_server
from tests.gemini_streams import array_elements, gemini_chunks, sse_body
from tests.upstream_server import Framing, Script

GEMINI = Dialect.GEMINI


@pytest.mark.timeout(600)
def test_the_requests_are_geminis_own(upstream):
    # The model in the path, `:streamGenerateContent?alt=sse` streamed and `:generateContent` whole;
    # `contents` and `generationConfig` in the body, no `model` or `stream` there; the key as
    # Google's `x-goog-api-key` (and the bearer token); then one body that is not JSON.
    chunks = gemini_chunks(["The quick", " brown fox."])
    whole = json.dumps(chunks[-1]).encode()
    prefix = upstream.route(Script(pieces=[sse_body(chunks)], json_body=whole))
    grade_server(f"{upstream.origin}{prefix}/v1beta", model="gemini-2.5-flash", api_key="k", dialect=GEMINI)
    sent = upstream.requests_under(prefix)
    models = f"{prefix}/v1beta/models/gemini-2.5-flash"
    assert [r.target for r in sent] == [
        *[f"{models}:streamGenerateContent?alt=sse", f"{models}:generateContent"] * 3,
        f"{models}:generateContent",
    ]
    asked = [r.json() for r in sent[:-1]]
    assert all("contents" in body and "model" not in body and "stream" not in body for body in asked)
    assert all(body["generationConfig"]["temperature"] == 0 for body in asked)
    assert sorted(body["generationConfig"].get("maxOutputTokens", 0) for body in asked) == [0, 0, 5, 5, 64, 64]
    assert {json.dumps(body.get("toolConfig")) for body in asked} == {"null", '{"functionCallingConfig": {"mode": "ANY"}}'}
    assert {(r.header("x-goog-api-key"), r.header("authorization")) for r in sent} == {("k", "Bearer k")}
    assert sent[-1].body == GEMINI_BAD_REQUEST


@pytest.mark.timeout(600)
def test_the_json_array_stream_form_is_read_as_well(upstream):
    # A server that streams the JSON-array form (the form without `alt=sse`) though asked for SSE:
    # the core frames it element by element, and the stream is judged the same.
    chunks = gemini_chunks(["The quick", " brown fox."])
    script = Script(pieces=array_elements(chunks), content_type="application/json", json_body=json.dumps(chunks[-1]).encode())
    card = grade_server(f"{upstream.origin}{upstream.route(script)}/v1beta", model="m", dialect=GEMINI)
    assert card.result("gemini-no-error").mark is Mark.PASS
    assert card.result("gemini-finish-reason").evidence == "3 streams: the last candidate chunk carries a finishReason"
    # This script answers the bad request like any other (200, a response): the shape check says so.
    assert card.result("gemini-error-shape").mark is Mark.FAIL


@pytest.mark.timeout(600)
def test_a_stream_without_a_finish_reason_fails_on_the_card(upstream):
    chunks = gemini_chunks(["The quick", " brown"], finish=None)
    script = Script(pieces=[sse_body(chunks)], json_body=json.dumps(chunks[-1]).encode(), framing=Framing.CLOSE_DELIMITED)
    card = grade_server(f"{upstream.origin}{upstream.route(script)}/v1beta", model="m", dialect=GEMINI)
    assert card.result("gemini-finish-reason").mark is Mark.FAIL
    assert card.result("gemini-json-finish-reason").evidence == "JSON a natural stop: its candidate carries no finishReason"
    assert card.setup["dialect"] == "gemini" and card.setup["path"] == "/models/{model}:generateContent"
    assert card.setup["stream_path"] == "/models/{model}:streamGenerateContent?alt=sse"
    assert set(card.not_run) == {"stream-null-not-empty", "stream-done-last", "stream-usage-after-finish", "n-choices"}


@pytest.mark.timeout(600)
def test_a_server_that_answers_the_gemini_path_404_is_one_line(upstream, capsys):
    # What an OpenAI-only server (llama.cpp, vLLM) answers: no card, one line that says why.
    refusal = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
    url = f"{upstream.origin}{upstream.route(Script(status=404, content_type='application/json', pieces=[refusal]))}/v1"
    with pytest.raises(GradeError, match="does not speak Gemini there"):
        grade_server(url, model="m", dialect=GEMINI)
    assert main(["server", "--url", url, "--model", "m", "--dialect", "gemini"]) == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {url}/models/m:streamGenerateContent?alt=sse answered HTTP 404"), err


@pytest.mark.timeout(600)
def test_the_model_comes_from_a_gemini_model_list(upstream):
    # Without --model, the first of `GET /models`: Gemini's list names `models/...`.
    listing = json.dumps({"models": [{"name": "models/gemini-2.5-flash"}]}).encode()
    prefix = upstream.route(Script(pieces=[listing], content_type="application/json", json_body=listing))
    grade_server(f"{upstream.origin}{prefix}/v1beta", dialect=GEMINI)
    targets = [r.target for r in upstream.requests_under(prefix)]
    assert targets[0] == f"{prefix}/v1beta/models"
    assert targets[1] == f"{prefix}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
