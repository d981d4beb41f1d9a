"""The lab's command lines (`python -m labs`, `python -m labs.gateways`): bad input is one line
naming the bad value and the valid ones, exit status 2; the scenario listing is one aligned column."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from faults.child_processes import run_child
from labs.clients import EVERY_CLIENT
from labs.scenario import load_scenarios

ROOT = Path(__file__).resolve().parent.parent

# Every test runs the lab's command line in a child Python.
pytestmark = pytest.mark.e2e


def lab(*arguments: str) -> tuple[int, str, str]:
    result = run_child([sys.executable, "-m", *arguments], cwd=ROOT, timeout=60)
    return result.returncode, result.stdout, result.stderr


def test_an_unknown_client_is_one_line_listing_every_client():
    status, out, err = lab("labs", "--client", "bogus")
    assert (status, out) == (2, "")
    assert err.startswith("error: argument --client: invalid choice: 'bogus' (choose from 'openai-python', ")
    # Every dialect's clients: the names of Chat, then those only the other dialects have.
    assert err.endswith(f"'{EVERY_CLIENT[-1]}') (see `python -m labs --help`)\n")
    assert all(f"'{client}'" in err for client in EVERY_CLIENT)
    assert err.count("\n") == 1


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_is_refused_since_nothing_would_run(jobs):
    assert lab("labs", "--jobs", jobs) == (
        2,
        "",
        f"error: argument --jobs: {jobs} cells in flight would run nothing: give 1 or more (see `python -m labs --help`)\n",
    )


def test_jobs_that_is_not_a_number_is_refused():
    assert lab("labs", "--jobs", "many") == (
        2,
        "",
        "error: argument --jobs: 'many' is not a whole number of cells (1 or more) (see `python -m labs --help`)\n",
    )


def test_the_scenario_listing_puts_every_title_in_one_column():
    status, out, _ = lab("labs", "--list")
    assert status == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == [s.name for s in load_scenarios()]
    # Some names are longer than 28 characters: the titles start where the longest name ends, plus two.
    width = max(len(s.name) for s in load_scenarios())
    assert width > 28
    for line, scenario in zip(lines, load_scenarios(), strict=True):
        assert line[width + 2 :].startswith(scenario.title), line


def test_the_scenario_listing_says_each_scenarios_dialects_and_the_default_runs():
    _, out, _ = lab("labs", "--list")
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["healthy"].endswith("  [chat, messages, responses, gemini]  (the coding agents too)")
    assert lines["tool-calls-omitted"].endswith("  [chat, messages, gemini; default run: chat, messages]")
    assert lines["reason-empty"].endswith("  [chat, messages, gemini; default run: chat]")
    assert lines["reason-omitted"].endswith("  [chat, messages, responses, gemini]  (the coding agents too)")
    assert lines["stop-reason-null"].endswith("  [messages]")
    assert lines["sliced"].endswith("  [chat, messages, responses, gemini]  (only with --all or --scenario)")
    # A failover row lists no Gemini: its spare needs a gateway that fails over.
    assert lines["flapping-primary"].endswith("  [chat, messages, responses]  (only with --all or --scenario)")


def test_an_unknown_dialect_is_one_line_naming_it_and_the_four():
    assert lab("labs", "--dialect", "anthropic") == (
        2,
        "",
        "error: argument --dialect: invalid choice: 'anthropic' (choose from 'chat', 'messages', 'responses', 'gemini') "
        "(see `python -m labs --help`)\n",
    )


def test_a_client_of_another_dialect_is_refused_before_anything_starts():
    assert lab("labs", "--dialect", "chat", "--client", "anthropic-python") == (
        2,
        "",
        "error: client 'anthropic-python' speaks messages, not chat\n",
    )


def test_a_scenario_of_another_dialect_is_refused_before_anything_starts():
    assert lab("labs", "--dialect", "chat", "--dialect", "responses", "--scenario", "stop-reason-null") == (
        2,
        "",
        "error: scenario 'stop-reason-null' runs in messages, not in chat, responses\n",
    )


def test_the_gateway_listing_takes_no_arguments():
    status, out, err = lab("labs.gateways", "bogus")
    assert (status, out) == (2, "")
    assert err == "error: unrecognized arguments: bogus (see `python -m labs.gateways --help`)\n"


def test_the_gateway_listing_has_help():
    status, out, _ = lab("labs.gateways", "--help")
    assert status == 0
    assert out.startswith("usage: python -m labs.gateways [-h]\n")
