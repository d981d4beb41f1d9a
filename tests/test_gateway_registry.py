"""The gateway registry (labs/gateways/registry.py): gateways are data, looked up by name; an
unknown name or a gateway that is not installed is one line saying what to do; and the books
readers of the routers added with it (SMG's JSON log, vllm-router's `none`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from faults.child_processes import run_child
from labs.cell_books import attach_books
from labs.cell_result import CellResult
from labs.gateways import EXTERNAL, GATEWAYS, tool_envs
from labs.gateways.registry import UnknownGateway, books_reader, entries, lookup, missing_installs
from labs.gateways.services import BOOKS_NONE, Gateway, GatewayNotInstalled, books_entry, open_gateways, read_books
from labs.gateways.smg import read_smg_books
from labs.outcome import BOOKS_ERROR, BOOKS_OK, Outcome

ROOT = Path(__file__).resolve().parent.parent

#: The lab's gateways in matrix order, as docs/lab.md names them.
LAB_GATEWAYS = (
    "direct",
    "finish_fix",
    "litellm",
    "litellm+finish_fix",
    "litellm-chat-bridge",
    "litellm-chat-bridge+finish_fix",
    "litellm-responses-bridge",
    "litellm-responses-bridge+finish_fix",
    "litellm-gemini-bridge",
    "litellm-gemini-bridge+finish_fix",
    "litellm-gemini-passthrough",
    "litellm-gemini-passthrough+finish_fix",
    "smg",
    "smg+finish_fix",
    "vllm-router",
    "envoy",
    "portkey",
    "portkey+finish_fix",
)


def test_the_lab_has_the_gateways_the_readme_names_in_matrix_order():
    assert GATEWAYS == LAB_GATEWAYS
    assert tuple(entries()) == (*LAB_GATEWAYS, EXTERNAL)


def test_every_lab_gateway_resolves_to_its_own_entry():
    for name in (*LAB_GATEWAYS, EXTERNAL):
        assert lookup(name).name == name


def test_an_unknown_gateway_is_refused_in_one_line_listing_the_valid_ones():
    with pytest.raises(UnknownGateway) as refused:
        lookup("smgg")
    message = str(refused.value)
    assert "\n" not in message
    assert message == f"unknown gateway 'smgg'; gateways: {', '.join((*LAB_GATEWAYS, EXTERNAL))}"


@pytest.mark.e2e
def test_the_lab_cli_refuses_an_unknown_gateway_in_one_line_listing_every_gateway():
    result = run_child([sys.executable, "-m", "labs", "--gateway", "bogus"], cwd=ROOT, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "error: argument --gateway: invalid choice: 'bogus' (choose from "
        + ", ".join(f"'{name}'" for name in (*LAB_GATEWAYS, EXTERNAL))
        + ") (see `python -m labs --help`)\n"
    )


def test_every_gateway_installed_by_make_setup_passes_its_install_check():
    # `make setup` ran before the tests (make test depends on it).
    assert missing_installs(GATEWAYS) == []


def test_a_router_environment_that_is_missing_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_envs, "GATEWAY_ENVS", tmp_path)
    problems = missing_installs(("smg", "vllm-router", "direct"))
    assert problems == [
        f"smg: smg==1.13.0 is not installed ({tmp_path}/smg/bin/smg missing): run `make setup`",
        f"vllm-router: vllm-router==0.1.17 is not installed ({tmp_path}/vllm-router/bin/vllm-router missing): run `make setup`",
    ]


def test_a_router_environment_older_than_its_requirements_is_reinstalled(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_envs, "GATEWAY_ENVS", tmp_path)
    (tmp_path / "smg" / "bin").mkdir(parents=True)
    (tmp_path / "smg" / "bin" / "smg").touch()
    stamp = tmp_path / "smg" / ".installed"
    stamp.touch()
    requirements = tool_envs.REQUIREMENTS / "smg.txt"
    old = requirements.stat().st_mtime - 10
    os.utime(stamp, (old, old))
    assert (
        tool_envs.missing_tool_env("smg", "smg", "smg==1.13.0")
        == f"smg==1.13.0 in {tmp_path / 'smg'} is older than smg.txt: run `make setup`"
    )


def test_open_gateways_refuses_a_gateway_that_is_not_installed_before_starting_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(tool_envs, "GATEWAY_ENVS", tmp_path / "nothing")

    async def start() -> None:
        # `finish_fix` comes first in the matrix: it would start a mitmdump if the check came late.
        async with open_gateways(("finish_fix", "smg"), primary_url="http://127.0.0.1:9", run_dir=tmp_path):
            raise AssertionError("started")

    with pytest.raises(GatewayNotInstalled, match=r"^smg: smg==1\.13\.0 is not installed .*run `make setup`$"):
        trio.run(start)
    assert not (tmp_path / "mitmdump.log").exists()


def test_the_gateway_listing_says_what_is_installed_and_what_to_do_otherwise(tmp_path, monkeypatch, capsys):
    from labs.gateways.__main__ import main

    monkeypatch.setattr(tool_envs, "GATEWAY_ENVS", tmp_path)
    assert main([]) == 0
    # Each gateway: a line with its name and status, then its summary, indented.
    status = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if not line.startswith(" "))
    assert list(status) == list(entries())
    assert status["smg"] == f"missing: smg==1.13.0 is not installed ({tmp_path}/smg/bin/smg missing): run `make setup`"
    assert status["finish_fix"] == "installed"
    assert status["litellm"] == "installed; takes the spare worker"
    assert status[EXTERNAL] == "yours: the lab does not start it"


def test_every_books_kind_has_a_reader_and_none_is_no_kind():
    kinds = {e.books_kind for e in entries().values()} - {None, BOOKS_NONE}
    assert kinds >= {"finish_fix", "litellm", "smg"}
    for kind in kinds:
        assert callable(books_reader(kind))
    with pytest.raises(ValueError, match=r"^no books reader for 'none'; books kinds: "):
        books_reader(BOOKS_NONE)


def test_the_spare_goes_to_every_gateway_that_can_have_two_upstreams():
    assert {n for n, e in entries().items() if e.uses_spare} >= {
        "litellm",
        "litellm+finish_fix",
        "smg",
        "smg+finish_fix",
        "vllm-router",
    }
    # mitmproxy's reverse mode takes one upstream; direct and external are no gateway of ours.
    assert not {n for n, e in entries().items() if e.uses_spare} & {"direct", "finish_fix", EXTERNAL}


def _cell(gateway: str, outcome: str = "error") -> CellResult:
    return CellResult(
        scenario="s",
        client="c",
        gateway=gateway,
        cell_id="c0001",
        outcome=Outcome(outcome),
        why="",
        report={},
        request_model="c0001;x=1",
    )


def test_a_gateway_without_per_request_records_says_none_never_a_blank():
    gateways = {
        "vllm-router": Gateway(name="vllm-router", base_url="http://x", books_kind=BOOKS_NONE),
        "direct": Gateway(name="direct", base_url="http://y"),
    }
    router, direct = _cell("vllm-router"), _cell("direct")
    attach_books([router, direct], gateways)
    assert (router.books, router.books_mismatch) == ("none", False)
    assert direct.books is None


# SMG 1.13.0's JSON log lines as it writes them (`--log-json`, tracing's JSON layer): the request's
# span carries `request_id`, `path` and, once the head went out, `status_code`.
def _smg_line(request_id: str, message: str, level: str = "DEBUG", status: int | None = None, **fields) -> dict:
    span: dict[str, object] = {
        "method": "POST",
        "module": "smg",
        "path": "/v1/chat/completions",
        "request_id": request_id,
        "version": "HTTP/1.1",
        "name": "http_request",
    }
    if status is not None:
        span["status_code"] = status
    return {
        "timestamp": "2026-12-01 06:45:19",
        "level": level,
        "message": message,
        **fields,
        "target": "smg::request",
        "span": span,
    }


def test_smg_books_follow_a_cell_by_the_worker_url_it_was_sent_to():
    lines = [
        _smg_line("chatcmpl-a", "started processing request", "INFO"),
        _smg_line("chatcmpl-a", "Sending request", url="http://127.0.0.1:5/cells/c0001"),
        _smg_line("chatcmpl-a", "finished processing request", "INFO", status=200),
        _smg_line("chatcmpl-b", "Sending request", url="http://127.0.0.1:5/cells/c0002"),
        _smg_line("chatcmpl-b", "finished processing request", "INFO", status=200),
        _smg_line("chatcmpl-b", "Stream ended by the worker before completion: error decoding response body", "WARN", status=200),
        # A probe of SMG's own health is no request of a cell.
        {
            **_smg_line("req-c", "finished probe request", status=200),
            "span": {"path": "/health", "request_id": "req-c", "status_code": 200},
        },
    ]
    word, entry = read_smg_books(lines, "c0001")
    assert (word, entry["status_code"], entry["problems"]) == (BOOKS_OK, 200, [])
    word, entry = read_smg_books(lines, "c0002")
    # The head said 200; the WARN it logged in the request's span is its record of the cut.
    assert (word, entry["status_code"]) == (BOOKS_ERROR, 200)
    assert entry["problems"] == ["WARN Stream ended by the worker before completion: error decoding response body"]
    assert read_smg_books(lines, "c0003") == (None, None)


def test_smg_books_judge_the_attempt_that_answered_not_the_one_it_retried():
    lines = [
        _smg_line("chatcmpl-a", "Sending request", url="http://127.0.0.1:5/cells/c0007"),
        _smg_line("chatcmpl-a", "Failed to send typed request worker_url=http://127.0.0.1:5/cells/c0007", "ERROR"),
        _smg_line("chatcmpl-a", "Sending request", url="http://127.0.0.1:6/cells/c0007"),
        _smg_line("chatcmpl-a", "finished processing request", "INFO", status=200),
    ]
    word, entry = read_smg_books(lines, "c0007")
    assert (word, len(entry["workers"]), len(entry["problems"])) == (BOOKS_OK, 2, 1)


def test_smg_books_know_a_request_it_refused_by_its_model():
    lines = [
        _smg_line("chatcmpl-a", "No worker serves model", "WARN", model_id="c0004;tokens=3"),
        _smg_line("chatcmpl-a", "request refused; reported by the refusing router", status=404),
    ]
    word, entry = read_smg_books(lines, "c0004")
    assert (word, entry["status_code"]) == (BOOKS_ERROR, 404)


def test_smg_books_read_from_its_log_file_skip_what_is_not_json(tmp_path: Path):
    log = tmp_path / "smg.log"
    log.write_text(
        "Starting router...\n"
        + "\n".join(
            json.dumps(line)
            for line in [
                _smg_line("chatcmpl-a", "Sending request", url="http://127.0.0.1:5/cells/c0009"),
                _smg_line("chatcmpl-a", "finished processing request", "INFO", status=200),
            ]
        )
        + "\n"
    )
    gateway = Gateway(name="smg", base_url="http://x", books_path=log, books_kind="smg")
    assert books_entry(gateway, read_books(log), "c0009")[0] == BOOKS_OK
