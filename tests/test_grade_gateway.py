"""`python -m labs.grade gateway`, aimed at real gateways: finish_fix (mitmdump with the addon, its
ledger as the books) and a plain mitmdump. The graded clients are cut down to the byte-level
reader and openai-python (one driver host) to keep each card to seconds; the CLI runs with the
default clients (docs/grading.md "A gateway")."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import trio

from faults.child_processes import free_port
from labs.grade.books import books_word, read_books_file
from labs.grade.card import EXIT_CANNOT_RUN, GradeError, Mark
from labs.grade.cli import main
from labs.grade.gateway_grader import grade_gateway
from labs.grade.gateway_plan import GatewayTarget
from tests.mitmdump_process import FINISH_FIX_SCRIPT

pytestmark = pytest.mark.e2e

RULE_1 = ("prefill-cut-fin", "prefill-cut-reset", "prefill-cut-hub-close")
RULE_2 = ("cut-after-tokens-fin", "cut-after-tokens-reset", "cut-after-tokens-hub-close", "cut-after-tokens-hub-error-event")
REASONS = ("reason-omitted", "reason-empty", "length-omitted", "tool-calls-omitted")


def grade(url: str, upstream_port: int, tmp_path: Path, **options) -> object:
    target = GatewayTarget(url=url, upstream_port=upstream_port, clients=("openai-python",), results_dir=tmp_path, **options)

    async def bounded():
        with trio.fail_after(150):
            return await grade_gateway(target)

    return trio.run(bounded)


def marks(card, checks) -> dict[str, Mark]:
    return {check: card.result(check).mark for check in checks}


@pytest.fixture
def finish_fix_gateway(start_mitmdump, tmp_path):
    """finish_fix in reverse mode with its ledger, upstream 127.0.0.1:P (nothing there yet)."""
    upstream_port, ledger = free_port(), tmp_path / "ledger.jsonl"
    mitmdump = start_mitmdump(
        mode=f"reverse:http://127.0.0.1:{upstream_port}", scripts=[FINISH_FIX_SCRIPT], options={"finish_fix_ledger": str(ledger)}
    )
    return f"{mitmdump.url}/v1", upstream_port, ledger


@pytest.mark.timeout(600)
def test_finish_fix_passes_rule_2_the_finish_reasons_and_its_books_but_cannot_retry(finish_fix_gateway, tmp_path):
    url, upstream_port, ledger = finish_fix_gateway
    card = grade(
        url,
        upstream_port,
        tmp_path,
        spare_port=free_port(),
        books_path=ledger,
        only=(*RULE_1, *RULE_2, *REASONS, "cuts-booked-as-errors"),
    )
    assert card.result("healthy").mark is Mark.PASS
    assert marks(card, RULE_2) == dict.fromkeys(RULE_2, Mark.PASS), [card.result(c).evidence for c in RULE_2]
    assert marks(card, REASONS) == dict.fromkeys(REASONS, Mark.PASS), [card.result(c).evidence for c in REASONS]
    assert card.result("cuts-booked-as-errors").mark is Mark.PASS, card.result("cuts-booked-as-errors").evidence
    # finish_fix has one upstream and cannot retry inside mitmproxy: rule 1 fails, and says why.
    assert marks(card, RULE_1) == dict.fromkeys(RULE_1, Mark.FAIL)
    assert card.result("prefill-cut-fin").evidence.endswith("the gateway never asked the spare")
    assert "stream was interrupted" in card.result("prefill-cut-fin").evidence
    assert card.result("reason-omitted").evidence.endswith("the gateway repaired the defect (its stream is well-formed)")
    assert card.exit_status == 1


@pytest.mark.timeout(600)
def test_without_a_spare_rule_1_is_not_tested_and_without_books_rule_3_not_checked(finish_fix_gateway, tmp_path):
    url, upstream_port, _ = finish_fix_gateway
    card = grade(url, upstream_port, tmp_path, only=(*RULE_1, "cut-after-tokens-fin", "cuts-booked-as-errors"))
    assert marks(card, RULE_1) == dict.fromkeys(RULE_1, Mark.NOT_TESTED)
    assert card.result("prefill-cut-fin").evidence.startswith("no --spare-port")
    assert card.result("cuts-booked-as-errors").mark is Mark.NOT_CHECKED
    assert card.result("cut-after-tokens-fin").mark is Mark.PASS
    assert card.exit_status == 0  # nothing failed: not tested and not checked are not failures


@pytest.mark.timeout(600)
def test_plain_mitmdump_fails_rule_2(start_mitmdump, tmp_path):
    upstream_port = free_port()
    mitmdump = start_mitmdump(mode=f"reverse:http://127.0.0.1:{upstream_port}")
    card = grade(f"{mitmdump.url}/v1", upstream_port, tmp_path, only=RULE_2)
    # Without streaming, mitmdump buffers the body: a cut becomes a 502 instead of the tokens.
    assert card.result("cut-after-tokens-fin").mark is Mark.FAIL
    assert card.result("cut-after-tokens-fin").evidence.startswith("the gateway answered HTTP 502 instead of streaming")
    # A hub that ends cleanly: the stream just stops, and a client calls it a success.
    hub_close = card.result("cut-after-tokens-hub-close")
    assert hub_close.mark is Mark.FAIL
    assert hub_close.evidence.startswith(
        "the stream just stopped: 6 events, then a clean end, no error event; openai-python: silent-truncation"
    )
    # The hub's own error event passes through untouched: that much a plain proxy gets right.
    assert card.result("cut-after-tokens-hub-error-event").mark is Mark.PASS
    assert card.exit_status == 1


def test_a_gateway_port_where_nothing_listens_exits_2_with_one_line(tmp_path, capsys):
    port = free_port()
    status = main(
        ["gateway", "--url", f"http://127.0.0.1:{port}/v1", "--upstream-port", str(free_port()), "--results", str(tmp_path)]
    )
    assert status == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert (
        err
        == f"error: cannot connect to the gateway at http://127.0.0.1:{port}/v1 (Connection refused); is it running? check --url\n"
    )


def test_an_upstream_port_that_is_taken_exits_2_with_one_line(tmp_path, capsys):
    with socket.socket() as taken, socket.socket() as gateway:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gateway.bind(("127.0.0.1", 0))
        gateway.listen()
        port = taken.getsockname()[1]
        status = main(
            [
                "gateway",
                "--url",
                f"http://127.0.0.1:{gateway.getsockname()[1]}/v1",
                "--upstream-port",
                str(port),
                "--results",
                str(tmp_path),
            ]
        )
    assert status == EXIT_CANNOT_RUN
    err = capsys.readouterr().err
    assert err.startswith(f"error: --upstream-port {port}: 127.0.0.1:{port} is taken") and err.count("\n") == 1


@pytest.mark.timeout(600)
def test_a_gateway_whose_upstream_is_elsewhere_cannot_be_graded(start_mitmdump, tmp_path):
    mitmdump = start_mitmdump(mode=f"reverse:http://127.0.0.1:{free_port()}")
    with pytest.raises(
        GradeError,
        match=r"^the gateway (answered HTTP 502|ended with transport error: .*) to a healthy request that never reached 127\.0\.0\.1:(\d+): point its upstream",
    ):
        grade(f"{mitmdump.url}/v1", free_port(), tmp_path, only=())


# -- the books file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "word"),
    [
        ({"verdict": "interrupted"}, "error"),
        ({"verdict": "malformed", "status": 200}, "error"),  # the client read garbage, whatever the status
        ({"verdict": "repaired", "status": 200}, "ok"),
        ({"verdict": "clean"}, "ok"),
        ({"status": 502}, "error"),
        ({"status": "200"}, "ok"),
        ({"status": "failure"}, "error"),
        ({"verdict": "whatever", "status": "success"}, "ok"),
        ({"verdict": "whatever"}, None),
        ({}, None),
    ],
)
def test_books_words(entry, word):
    assert books_word(entry) == word


def test_books_file_finds_requests_by_id_or_model_and_the_last_line_counts(tmp_path):
    path = tmp_path / "books.jsonl"
    lines = [
        {"request_id": "c0001", "status": "success"},
        {"model": "lab/c0002;tokens=12;model=finishline-worker", "verdict": "ok"},
        "not json",
        {"model": "c0002;tokens=12", "verdict": "interrupted"},
        {"model": 7, "verdict": "error"},
    ]
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    found = read_books_file(path)
    assert {key: word for key, (word, _) in found.items()} == {"c0001": "ok", "c0002": "error"}
