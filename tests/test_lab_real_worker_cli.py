"""`python -m labs --worker`: the values it takes, and the scenarios a real worker cannot run, refused
in one line before anything starts. Pure: no process (a refused run starts none)."""

from __future__ import annotations

import pytest

from finishline import Dialect
from labs.__main__ import REAL_SERVER_GATEWAYS, REAL_SERVER_SECTION, _plain_default_run, main, select_scenarios, split_by_worker
from labs.dialects import LAB_DIALECTS
from labs.worker.real import (
    LLAMA_CPP,
    REAL_WORKER_DIALECTS,
    RealWorkerError,
    needs_simulated_worker,
    parse_worker_url,
    pinned_body,
)
from labs.worker.settings import WorkerSettings


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_bad_worker_is_refused_in_one_line_naming_the_valid_values(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--worker", "vllm"])
    assert exit.value.code == 2
    err = one_line_error(capsys)
    assert "'vllm' is not simulated, llama.cpp or an http:// base URL" in err


def test_a_scenario_that_needs_a_worker_knob_is_refused_by_name(capsys):
    assert main(["--worker", LLAMA_CPP, "--scenario", "reason-omitted"]) == 2
    err = one_line_error(capsys)
    assert "scenario 'reason-omitted' needs the simulated worker" in err and "finish" in err


def test_a_worker_model_needs_a_url_worker(capsys):
    assert main(["--worker", LLAMA_CPP, "--worker-model", "x", "--scenario", "healthy"]) == 2
    assert "--worker-model names the model of a URL worker" in one_line_error(capsys)


def test_every_scenario_with_a_worker_knob_is_na_for_a_real_worker_and_the_network_faults_run():
    runnable, left_out = split_by_worker(select_scenarios(None, True), LLAMA_CPP)
    names = {s.name for s in runnable}
    assert {
        "healthy",
        "cut-during-prefill",
        "cut-after-tokens-fin",
        "cut-after-tokens-reset",
        "cut-after-tokens-conn-close",
        "cut-after-tokens-hub-close",
        "cut-after-tokens-hub-error-event",
        "stall-after-tokens",
        "reset-before-head",
        "incident-prefill-cut-hub-close",
        "rule1-prefill-cut-hub-close-spare",
        "rule1-prefill-cut-hub-abort-spare",
    } <= names
    na = {entry["name"]: entry for entry in left_out}
    for name in ("reason-omitted", "malformed-chunk", "http-429-before-stream", "http-500-once", "slow-first-token"):
        assert na[name]["why"] == "needs the simulated worker", name
    assert not names & set(na)


def test_a_real_worker_takes_the_network_knobs_and_the_answers_pace_only():
    assert (
        needs_simulated_worker(WorkerSettings(tokens=12, token_delay=0.01, connection_close=True, reset_before_head=True)) == ()
    )
    assert needs_simulated_worker(WorkerSettings(bare_error=True, error_after=5)) == ("error_after", "bare_error")
    # A slow first token with no fault is the worker's own pace: only the simulated worker has it.
    assert needs_simulated_worker(WorkerSettings(prefill_delay=20.0), faulted=False) == ("prefill_delay",)
    assert needs_simulated_worker(WorkerSettings(prefill_delay=1.0), faulted=True) == ()


@pytest.mark.parametrize(
    ("dialect", "field"),
    [(Dialect.CHAT, "max_tokens"), (Dialect.MESSAGES, "max_tokens"), (Dialect.RESPONSES, "max_output_tokens")],
)
def test_every_cells_request_is_pinned_to_the_servers_model_the_runs_limit_and_greedy(dialect, field):
    sent = {"model": "c0001;tokens=12", "max_completion_tokens": 4096, "temperature": 0.7, "top_p": 0.9, "stream": True}
    pinned = pinned_body(sent, dialect, model="SmolLM2.gguf", max_tokens=48)
    assert pinned["model"] == "SmolLM2.gguf" and pinned[field] == 48 and pinned["temperature"] == 0
    assert "top_p" not in pinned and "max_completion_tokens" not in pinned and pinned["stream"] is True


@pytest.mark.parametrize(
    ("url", "parsed"),
    [("http://127.0.0.1:8080/v1", ("127.0.0.1", 8080, "/v1")), ("http://localhost:11434/v1/", ("localhost", 11434, "/v1"))],
)
def test_a_url_worker_is_host_port_and_path(url, parsed):
    assert parse_worker_url(url) == parsed


@pytest.mark.parametrize("url", ["https://example.com/v1", "127.0.0.1:8080", "http://:80/v1"])
def test_a_url_worker_must_be_plain_http_with_a_host(url):
    with pytest.raises(RealWorkerError, match="not simulated, llama.cpp or an http:// base URL"):
        parse_worker_url(url)


@pytest.mark.parametrize(
    ("argv", "plain"),
    [([], True), (["--jobs", "8"], True), (["--results=/tmp/x"], True), (["--scenario", "healthy"], False), (["--all"], False)],
)
def test_only_the_plain_default_run_ends_with_the_real_server_section(argv, plain):
    assert _plain_default_run(argv) is plain


def test_the_real_server_section_is_llama_cpp_healthy_and_a_hidden_cut_in_every_dialect():
    scenarios = select_scenarios(list(REAL_SERVER_SECTION), False, dialects=REAL_WORKER_DIALECTS)
    assert [s.name for s in scenarios] == ["healthy", "cut-after-tokens-hub-close"]
    # Every dialect a real server speaks: no Gemini (the front relays no Gemini route).
    assert REAL_WORKER_DIALECTS == tuple(d for d in LAB_DIALECTS if d is not Dialect.GEMINI)
    assert all(s.dialects == REAL_WORKER_DIALECTS for s in scenarios)
    assert split_by_worker(scenarios, LLAMA_CPP) == (scenarios, [])
    assert REAL_SERVER_GATEWAYS == ("direct", "finish_fix")


def test_a_coding_agent_asked_for_with_a_real_worker_is_refused_in_one_line(capsys):
    assert main(["--worker", LLAMA_CPP, "--client", "claude-code", "--scenario", "healthy"]) == 2
    assert "claude-code: the coding agents need the simulated worker" in one_line_error(capsys)


def test_gemini_asked_for_with_a_real_worker_is_refused_in_one_line(capsys):
    assert main(["--worker", LLAMA_CPP, "--dialect", "gemini", "--scenario", "healthy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dialect gemini: a real worker speaks chat, messages, responses") and err.count("\n") == 1
