"""`python -m labs.grade server`: a healthy worker passes every check, and each worker defect fails
exactly the checks named after it (the rest pass, or are `not tested` where the defect leaves
nothing to judge). The worker comes from the package's own pytest plugin (`finishline_worker`)."""

from __future__ import annotations

import json

import pytest

from labs.grade.card import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_PASSED, Mark
from labs.grade.cli import main
from labs.grade.server_checks import SERVER_CHECKS
from labs.grade.server_grader import grade_server
from tests.chat_streams import chat_stream
from tests.upstream_server import Script

ALL_CHECKS = {c.check for c in SERVER_CHECKS}
# Checks that have nothing to judge once every stream and completion ended in an error.
NEEDS_A_COMPLETED_ANSWER = {
    "stream-finish-reason",
    "stream-usage-after-finish",
    "reason-stop",
    "reason-length",
    "reason-tool-calls",
    "n-choices",
    "json-finish-reason",
    "stream-json-agree",
}
# Checks that judge the reason's value: without any reason they have nothing to judge.
JUDGE_THE_REASON_VALUE = {"reason-stop", "reason-length", "reason-tool-calls"}

# defect -> (checks that fail, checks that are not tested); every other check passes.
DEFECTS = {
    "finish=omitted": ({"stream-finish-reason", "json-finish-reason"}, JUDGE_THE_REASON_VALUE),
    "finish=empty": ({"stream-finish-reason", "stream-null-not-empty", "json-finish-reason"}, JUDGE_THE_REASON_VALUE),
    "done=0": ({"stream-done-last"}, set()),
    "error_after=2": ({"stream-no-error", "json-no-error"}, NEEDS_A_COMPLETED_ANSWER),
}


def marks(card) -> dict[str, Mark]:
    return {row.check: row.mark for row in card.results}


@pytest.mark.timeout(600)
def test_a_healthy_worker_passes_every_check(finishline_worker):
    card = grade_server(finishline_worker())
    assert marks(card) == dict.fromkeys(ALL_CHECKS, Mark.PASS), [r.evidence for r in card.results if r.mark is not Mark.PASS]
    assert card.exit_status == EXIT_PASSED


@pytest.mark.timeout(600)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_fails_exactly_the_checks_it_breaks(finishline_worker, defect):
    failing, untested = DEFECTS[defect]
    card = grade_server(finishline_worker(defect))
    expected = {
        check: Mark.FAIL if check in failing else Mark.NOT_TESTED if check in untested else Mark.PASS for check in ALL_CHECKS
    }
    assert marks(card) == expected
    assert card.exit_status == EXIT_FAILED
    for row in card.results:
        if row.mark is Mark.NOT_TESTED:
            # A check with nothing to judge names the check that failed, so a reader finds the cause.
            assert any(name in row.evidence for name in failing), row.evidence


@pytest.mark.timeout(600)
def test_evidence_says_what_was_seen(finishline_worker):
    card = grade_server(finishline_worker("finish=empty"))
    assert card.result("stream-null-not-empty").evidence.endswith(
        'has "finish_reason": "" on 17 chunks (null is the spec\'s "not yet")'
    )
    assert "the core: injected finish_reason 'stop' for choice 0 before [DONE]" in card.result("stream-finish-reason").evidence
    assert card.result("json-finish-reason").evidence.startswith("JSON a natural stop: choice 0 finish_reason is ''")


@pytest.mark.timeout(600)
def test_a_wrong_reason_fails_the_reason_check(finishline_worker):
    # max_tokens pinned above the answer's length: the worker stops naturally, so a request that
    # asks for max_tokens=5 gets "stop" where a server must say "length".
    card = grade_server(finishline_worker("max_tokens=100"))
    row = card.result("reason-length")
    assert (row.mark, row.evidence) == (Mark.FAIL, "stream max_tokens=5 ended with 'stop', expected 'length'")


@pytest.mark.timeout(600)
def test_cli_exit_status_and_outputs(finishline_worker, tmp_path, capsys):
    url = finishline_worker()
    assert (
        main(["server", "--url", url, "--json", str(tmp_path / "card.json"), "--html", str(tmp_path / "card.html")])
        == EXIT_PASSED
    )
    out = capsys.readouterr().out
    assert f"server {url}" in out and out.rstrip().endswith("12 pass; exit status 0")
    saved = json.loads((tmp_path / "card.json").read_text())
    assert saved["exit_status"] == 0 and {r["check"] for r in saved["results"]} == ALL_CHECKS
    assert saved["counts"] == {"pass": 12, "fail": 0, "not tested": 0, "not checked": 0}
    page = (tmp_path / "card.html").read_text()
    assert "stream-json-agree" in page and "<script" not in page
    assert main(["server", "--url", finishline_worker("done=0")]) == EXIT_FAILED


@pytest.mark.timeout(600)
def test_cli_names_the_model_it_asked_for(finishline_worker, tmp_path):
    url = finishline_worker()
    assert main(["server", "--url", url, "--model", "my-model", "--json", str(tmp_path / "c.json")]) == EXIT_PASSED
    assert json.loads((tmp_path / "c.json").read_text())["setup"]["model"] == "my-model"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["server", "--url", "127.0.0.1:8000"], "error: argument --url: '127.0.0.1:8000' is not an http:// or https:// base URL"),
        (["server"], "error: the following arguments are required: --url"),
        (
            ["gateway", "--url", "http://127.0.0.1:9/v1", "--upstream-port", "70000"],
            "error: argument --upstream-port: 70000 is not a port number (1-65535)",
        ),
        (
            ["gateway", "--url", "http://127.0.0.1:9/v1", "--upstream-port", "9000", "--spare-port", "9000"],
            "error: --spare-port 9000 is the --upstream-port",
        ),
        (
            ["gateway", "--url", "http://127.0.0.1:9/v1", "--upstream-port", "9000", "--client", "curl"],
            "error: argument --client: invalid choice: 'curl'",
        ),
        (
            ["gateway", "--url", "http://127.0.0.1:9/v1", "--upstream-port", "9000", "--stall-deadline", "0"],
            "error: argument --stall-deadline: 0 must be above 0 seconds",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_a_port_where_nothing_listens_exits_2_with_one_line(capsys):
    # The same words as the gateway grader's (the OS's, not httpx's "[Errno 111] ..." or trio's
    # "all attempts to connect ... failed").
    assert main(["server", "--url", "http://127.0.0.1:9/v1"]) == EXIT_CANNOT_RUN
    assert (
        capsys.readouterr().err
        == "error: cannot connect to the server at http://127.0.0.1:9/v1 (Connection refused); is it running? check --url\n"
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("output", ["--json", "--html"])
def test_an_output_that_cannot_be_written_exits_2_with_one_line(finishline_worker, tmp_path, capsys, output):
    url = finishline_worker()
    # A folder is refused before the requests are sent.
    with pytest.raises(SystemExit) as exited:
        main(["server", "--url", url, output, str(tmp_path)])
    assert exited.value.code == EXIT_CANNOT_RUN
    assert (
        capsys.readouterr().err
        == f"error: {output} {tmp_path}: is a folder; give a file path (see `python -m labs.grade --help`)\n"
    )
    # A path under a file cannot be made: the card is printed, then one line, exit 2.
    (tmp_path / "file").write_text("")
    blocked = tmp_path / "file" / "card.out"
    assert main(["server", "--url", url, output, str(blocked)]) == EXIT_CANNOT_RUN
    captured = capsys.readouterr()
    assert captured.out.rstrip().endswith("12 pass; exit status 0")
    assert captured.err == f"error: {output} {blocked}: cannot write it (File exists: {tmp_path / 'file'})\n"
    # Missing folders on the way are made.
    assert main(["server", "--url", url, output, str(tmp_path / "new" / "folder" / "card.out")]) == EXIT_PASSED
    assert (tmp_path / "new" / "folder" / "card.out").read_text()


@pytest.mark.timeout(600)
def test_streams_are_asked_uncompressed_and_a_compressed_one_is_not_judged(upstream):
    # A server that gzips its stream although the grader asked for identity (finish_fix's rule C10
    # case): its bytes are not SSE, so every check that reads the streams is not tested, saying
    # why, instead of failing `stream-done-last` or passing `stream-null-not-empty` on nothing.
    prefix = upstream.route(Script(pieces=chat_stream(["The", " quick"]), gzip=True))
    card = grade_server(f"{upstream.origin}{prefix}/v1", model="m")
    assert {r.header("accept-encoding") for r in upstream.requests_under(prefix)} == {"identity"}
    stream_checks = {c.check for c in SERVER_CHECKS if c.reads_streams}
    assert marks(card) == {**dict.fromkeys(stream_checks | {"json-finish-reason"}, Mark.NOT_TESTED), "json-no-error": Mark.FAIL}
    assert card.result("stream-done-last").evidence == (
        "stream a natural stop: the body came gzip-compressed although the grader asked for accept-encoding: identity, "
        "so its events were not read"
    )
    # Not streamed, httpx decodes the body as a client would: here SSE where JSON belongs.
    assert card.result("json-no-error").evidence == "JSON a natural stop: not a chat.completion with choices"


@pytest.mark.timeout(600)
def test_a_refused_request_is_an_answer_the_checks_judge(finishline_worker, capsys):
    # The worker answers 400 to settings it does not know (here in the model name). Unlike a
    # connection refused, that is the server's answer: the checks run, fail, and name the status.
    url = finishline_worker()
    assert main(["server", "--url", url, "--model", "finishline-worker;bogus=1"]) == EXIT_FAILED
    assert "stream a natural stop: HTTP 400" in capsys.readouterr().out
