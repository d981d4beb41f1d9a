"""The coding agents as the lab's clients, without starting one: their names and dialects, where
they run, how each cell's command is made, how a command's report is judged, the bridge into
their namespace, and the pinned output limit that keeps their bytes the scenario's.

What the real agents do is in tests/test_lab_agents_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import trio

from finishline import Dialect
from labs.__main__ import select_scenarios
from labs.clients import AGENT_CLIENTS, AGENT_CLIENTS_BY_DIALECT, CLIENTS_BY_DIALECT, runtime_of
from labs.clients.agent_bridge import open_lab_side, serve_namespace_side
from labs.clients.agent_clis import AGENTS, GEMINI_SETTINGS, AgentCell, missing_agents
from labs.clients.agent_output import AgentOutput, last_line, read_gemini_json, read_text_output
from labs.dialects import LAB_DIALECTS
from labs.outcome import ClientReport, Expected, Outcome, judge
from labs.plan import LabConfig, plan_cells
from labs.scenario import AGENT_DEADLINE_S, SCENARIO_DIR, ScenarioError, load_scenario
from labs.table import render_table
from labs.worker.server import reset_on_close
from tests.fixtures_lab import run_trio

ANSWER = "The quick brown fox jumps over the lazy dog. The quick brown"


def test_the_agents_are_these_four_clients_in_the_dialects_they_speak():
    assert AGENT_CLIENTS == ("pi-coding-agent", "claude-code", "codex", "gemini-cli")
    speakers = {
        Dialect.CHAT: ("pi-coding-agent",),
        Dialect.MESSAGES: ("pi-coding-agent", "claude-code"),
        Dialect.RESPONSES: ("pi-coding-agent", "codex"),
        Dialect.GEMINI: ("gemini-cli",),
    }
    assert AGENT_CLIENTS_BY_DIALECT == {dialect: speakers[dialect] for dialect in LAB_DIALECTS}
    # After the libraries in each dialect's columns, run by no driver host.
    for dialect, agents in AGENT_CLIENTS_BY_DIALECT.items():
        columns = CLIENTS_BY_DIALECT[dialect]
        assert columns[len(columns) - len(agents) :] == agents
    assert {runtime_of(name) for name in AGENT_CLIENTS} == {"agent"}


# -- where they run ------------------------------------------------------------------------------


def _scenario(tmp_path: Path, text: str = "", name: str = "s") -> Path:
    path = tmp_path / f"{name}.toml"
    # In every dialect (Gemini runs only where a scenario lists it), so every agent may be planned.
    dialects = ", ".join(f'"{dialect.value}"' for dialect in LAB_DIALECTS)
    path.write_text(f'title = "x"\ndeadline_s = 5\ndialects = [{dialects}]\n' + text)
    return path


def _planned_clients(scenario) -> set[str]:
    config = LabConfig(scenarios=(scenario,), gateways=("direct",), dialects=LAB_DIALECTS)
    return {cell.client for cell in plan_cells(config)}


def test_agents_run_only_in_a_scenario_that_says_agents_true(tmp_path):
    assert not _planned_clients(load_scenario(_scenario(tmp_path))) & set(AGENT_CLIENTS)
    assert _planned_clients(load_scenario(_scenario(tmp_path, "agents = true\n"))) >= set(AGENT_CLIENTS)


def test_a_scenario_asked_for_by_name_runs_the_agents_too(tmp_path):
    _scenario(tmp_path, name="plain")
    (scenario,) = select_scenarios(["plain"], everything=False, directory=tmp_path)
    assert scenario.agents and _planned_clients(scenario) >= set(AGENT_CLIENTS)
    # Not asked for by name, the file decides.
    (listed,) = select_scenarios(None, everything=True, directory=tmp_path)
    assert not listed.agents


def test_the_agents_scenarios_are_healthy_reason_omitted_and_the_hidden_cut():
    chosen = [s.name for s in select_scenarios(None, everything=True) if s.agents]
    assert chosen == ["healthy", "reason-omitted", "cut-after-tokens-hub-close"]


def test_agents_must_be_true_or_false(tmp_path):
    with pytest.raises(ScenarioError, match=r"`agents` must be true or false, not 'yes'"):
        load_scenario(_scenario(tmp_path, 'agents = "yes"\n'))


def test_an_agent_cell_gets_at_least_the_agents_deadline():
    scenario = load_scenario(SCENARIO_DIR / "cut-after-tokens-hub-close.toml")
    assert scenario.deadline_for("pi-ai") == scenario.deadline_s == 15
    assert {scenario.deadline_for(agent) for agent in AGENT_CLIENTS} == {AGENT_DEADLINE_S}


# -- each agent's command ------------------------------------------------------------------------


def _cell(tmp_path: Path, dialect: Dialect) -> AgentCell:
    return AgentCell(
        home=tmp_path,
        dialect=dialect,
        base_url="http://127.0.0.1:4123/v1",
        model="c0007;tokens=12;n=1",
        api_key="sk-lab",
        prompt="Say the sentence about the fox.",
    )


@pytest.mark.parametrize(("name", "dialect"), [(a, d) for a, agent in AGENTS.items() for d in agent.dialects])
def test_an_agents_environment_is_its_cells_own_and_nothing_of_the_labs(tmp_path, monkeypatch, name, dialect):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-of-the-user")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    command = AGENTS[name].command(_cell(tmp_path, dialect))
    assert command.env["HOME"] == str(tmp_path)
    assert command.env["TMPDIR"].startswith(str(tmp_path))
    assert "OPENAI_API_KEY" not in command.env and "HTTPS_PROXY" not in command.env
    # Claude Code's sandbox switch would make it probe the network (probeContainedNoInternet).
    assert "IS_SANDBOX" not in command.env
    # Every config directory inside the cell's home.
    for key in (
        "PI_CODING_AGENT_DIR",
        "CLAUDE_CONFIG_DIR",
        "CLAUDE_CODE_TMPDIR",
        "CODEX_HOME",
        "GEMINI_CLI_HOME",
        "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
        "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
    ):
        if key in command.env:
            assert command.env[key].startswith(str(tmp_path))


@pytest.mark.parametrize("dialect", list(AGENTS["pi-coding-agent"].dialects))
def test_pis_agent_gets_one_model_named_after_the_cell_on_the_dialects_api(tmp_path, dialect):
    command = AGENTS["pi-coding-agent"].command(_cell(tmp_path, dialect))
    models = json.loads((Path(command.env["PI_CODING_AGENT_DIR"]) / "models.json").read_text())
    provider = models["providers"]["finishline"]
    assert (
        provider["api"]
        == {"chat": "openai-completions", "messages": "anthropic-messages", "responses": "openai-responses"}[dialect]
    )
    # Its Anthropic client appends /v1/messages itself.
    assert provider["baseUrl"] == ("http://127.0.0.1:4123" if dialect is Dialect.MESSAGES else "http://127.0.0.1:4123/v1")
    assert [m["id"] for m in provider["models"]] == ["c0007;tokens=12;n=1"]
    assert command.argv[-5:] == ("--provider", "finishline", "--model", "c0007;tokens=12;n=1", "Say the sentence about the fox.")
    assert command.argv[2] == "-p"
    assert {command.env[k] for k in ("PI_OFFLINE", "PI_SKIP_VERSION_CHECK")} == {"1"} and command.env["PI_TELEMETRY"] == "0"


def test_claude_code_gets_the_cells_model_the_gateways_root_and_every_traffic_switch(tmp_path):
    command = AGENTS["claude-code"].command(_cell(tmp_path, Dialect.MESSAGES))
    assert command.argv[1:] == ("-p", "--model", "c0007;tokens=12;n=1", "Say the sentence about the fox.")
    assert command.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4123"
    assert command.env["ANTHROPIC_API_KEY"] == "sk-lab"
    for switch in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_FEATURE_FLAGS",
    ):
        assert command.env[switch] == "1"
    # Behaviour stays Claude Code's own: its retries and its fallback to a request without streaming.
    assert not {"CLAUDE_CODE_MAX_RETRIES", "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK"} & set(command.env)


def test_codex_gets_a_responses_provider_for_the_gateway_with_its_traffic_off(tmp_path):
    command = AGENTS["codex"].command(_cell(tmp_path, Dialect.RESPONSES))
    config = tomllib.loads((Path(command.env["CODEX_HOME"]) / "config.toml").read_text())
    assert config["model"] == "c0007;tokens=12;n=1"
    assert config["model_providers"][config["model_provider"]] == {
        "name": "finishline",
        "base_url": "http://127.0.0.1:4123/v1",
        "wire_api": "responses",
        "env_key": "FINISHLINE_API_KEY",
    }
    assert command.env["FINISHLINE_API_KEY"] == "sk-lab"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["otel"] == {"exporter": "none"} and config["features"] == {"plugins": False}
    assert command.argv[2:] == ("exec", "--skip-git-repo-check", "Say the sentence about the fox.")


def test_gemini_cli_gets_the_gateways_root_api_key_auth_a_trusted_folder_and_its_traffic_off(tmp_path):
    command = AGENTS["gemini-cli"].command(_cell(tmp_path, Dialect.GEMINI))
    # The cell's model as `-m` (the path it builds carries it as it is), JSON output to be read.
    assert command.argv[2:] == (
        *("-p", "Say the sentence about the fox.", "-m", "c0007;tokens=12;n=1", "--output-format", "json"),
    )
    # Its SDK appends /v1beta/models/...; a dummy key; the trust it needs headless (else exit 55).
    assert command.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:4123"
    assert command.env["GEMINI_API_KEY"] == "sk-lab"
    assert command.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert command.env["GEMINI_TELEMETRY_ENABLED"] == "false"
    # The machine's settings files are files of the cell's folder that do not exist.
    for key in ("GEMINI_CLI_SYSTEM_SETTINGS_PATH", "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"):
        assert not Path(command.env[key]).exists()
    settings = json.loads((tmp_path / ".gemini" / "settings.json").read_text())
    assert settings == GEMINI_SETTINGS
    # API-key auth (the auth `GOOGLE_GEMINI_BASE_URL` alone picks is refused headless: exit 41).
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"] == {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
    assert settings["ide"]["enabled"] is False


@pytest.mark.parametrize(
    ("base_url", "root"),
    [
        ("http://127.0.0.1:4123/v1", "http://127.0.0.1:4123"),
        # LiteLLM's native Gemini routes: the gateway gives Gemini clients `/v1beta`.
        ("http://127.0.0.1:4123/v1beta", "http://127.0.0.1:4123"),
        # LiteLLM's Gemini pass-through: the route's prefix stays.
        ("http://127.0.0.1:4123/gemini/v1", "http://127.0.0.1:4123/gemini"),
        ("http://127.0.0.1:4123/", "http://127.0.0.1:4123"),
    ],
)
def test_an_agents_root_is_its_base_url_without_the_version(tmp_path, base_url, root):
    assert dataclasses.replace(_cell(tmp_path, Dialect.GEMINI), base_url=base_url).api_root == root


def test_an_agent_not_installed_is_named_with_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setitem(AGENTS, "codex", dataclasses.replace(AGENTS["codex"], needs=(tmp_path / "gone",)))
    line = missing_agents(("codex", "pi-ai"))
    assert line is not None and line.startswith("codex not installed: run `npm ci` in ")


# -- judging a command ---------------------------------------------------------------------------

EXPECTED = Expected(text=ANSWER, finish_reason="end_turn", dialect=Dialect.MESSAGES)


def _command_report(**fields) -> ClientReport:
    return ClientReport(
        **{"client": "claude-code", "completed": True, "text": ANSWER, "exit_code": 0, "interfaces": ["lo"], **fields}
    )


def test_exit_0_with_the_whole_answer_printed_is_ok():
    judgement = judge(_command_report(), EXPECTED)
    assert judgement.outcome is Outcome.OK and judgement.reason == "exit 0, the worker's whole answer printed"


def test_exit_0_with_less_printed_is_a_silent_truncation():
    judgement = judge(_command_report(text="The quick brown fox jumps"), EXPECTED)
    assert judgement.outcome is Outcome.SILENT_TRUNCATION
    assert judgement.reason == f"exit 0 with 25 characters printed, shorter than the worker's {len(ANSWER)}"


def test_exit_0_after_a_worker_that_answered_with_an_error_is_a_silent_truncation():
    failed = Expected(text="The quick", finish_reason=None, dialect=Dialect.MESSAGES)
    assert judge(_command_report(text="The quick"), failed).outcome is Outcome.SILENT_TRUNCATION


def test_an_exit_status_other_than_0_is_an_error_in_the_agents_own_words():
    report = _command_report(completed=False, text="", exit_code=1, error_message="Stream ended without finish_reason")
    judgement = judge(report, EXPECTED)
    assert judgement.outcome is Outcome.ERROR and judgement.reason == "exit 1: Stream ended without finish_reason"


def test_an_agent_stopped_at_the_deadline_is_a_hang():
    report = _command_report(completed=False, text="", exit_code=None, timed_out=True)
    assert judge(report, EXPECTED).outcome is Outcome.HANG


def test_a_library_without_an_exit_status_is_judged_as_before():
    library = ClientReport(client="pi-ai", completed=True, text=ANSWER, finish_reason=None)
    assert judge(library, EXPECTED).reason == "full answer; no finish reason surfaced (true reason: end_turn)"


def test_exit_0_with_a_failure_told_is_an_error_in_the_agents_own_words():
    # gemini-cli after four attempts at a stream without a finishReason: exit 0, the JSON's error.
    words = "INVALID_STREAM: Model stream ended without a finish reason."
    report = _command_report(client="gemini-cli", completed=False, text=ANSWER * 4, error_message=words)
    judgement = judge(report, Expected(text=ANSWER, finish_reason="STOP", dialect=Dialect.GEMINI))
    assert judgement.outcome is Outcome.ERROR and judgement.reason == f"exit 0: {words}"


# -- reading an agent's output -------------------------------------------------------------------

# What gemini-cli 0.61.0 printed with `--output-format json`, measured against a listener in its
# namespace (the stats trimmed): a whole answer; four attempts at a stream without a finishReason
# (exit 0); an HTTP 400 (exit 144, 400 % 256: the document on stderr after the error's stack).
GEMINI_NOISE = "Ripgrep is not available. Falling back to GrepTool.\n[STARTUP] Phase 'cleanup_ops' was started but never ended.\n"
GEMINI_OK = '{\n  "session_id": "78496473",\n  "response": "Hello world",\n  "stats": {\n    "models": {}\n  }\n}'
GEMINI_INVALID_STREAM = (
    '{\n  "session_id": "e8525930",\n  "response": "Hello worldHello worldHello worldHello world",\n'
    '  "stats": {\n    "models": {}\n  },\n  "error": {\n    "type": "INVALID_STREAM",\n'
    '    "message": "Model stream ended without a finish reason."\n  }\n}'
)
GEMINI_HTTP_400 = (
    "Error when talking to Gemini API Full report available at: /tmp/x.json _ApiError: "
    '{"error":{"code":400,"message":"bad thing","status":"INVALID_ARGUMENT"}}\n'
    "    at throwErrorIfNotOK (file:///bundle/chunk-JDPZ4CE3.js:267833:24) {\n  status: 400\n}\n"
    '{\n  "session_id": "26055001",\n  "error": {\n    "type": "Error",\n'
    '    "message": "{\\"error\\":{\\"code\\":400,\\"message\\":\\"bad thing\\",\\"status\\":\\"INVALID_ARGUMENT\\"}}",\n'
    '    "code": 400\n  }\n}\n'
)


def test_gemini_clis_answer_is_its_json_response():
    assert read_gemini_json(GEMINI_OK + "\n", GEMINI_NOISE, 0) == AgentOutput(text="Hello world", error=None)


def test_gemini_clis_exit_0_after_an_invalid_stream_is_a_failure_told():
    output = read_gemini_json(GEMINI_INVALID_STREAM, GEMINI_NOISE, 0)
    assert output == AgentOutput(
        text="Hello worldHello worldHello worldHello world", error="INVALID_STREAM: Model stream ended without a finish reason."
    )


def test_gemini_clis_fatal_error_is_the_document_on_stderr():
    output = read_gemini_json("", GEMINI_NOISE + GEMINI_HTTP_400, 144)
    assert output.error == 'Error: {"error":{"code":400,"message":"bad thing","status":"INVALID_ARGUMENT"}}'
    # Without a document anywhere, its last line.
    assert read_gemini_json("", GEMINI_NOISE + "Killed\n", 137) == AgentOutput(text="", error="Killed")
    # A document without an error after a non-zero exit: the last line of stderr.
    assert read_gemini_json(GEMINI_OK, "Stopped\n", 1) == AgentOutput(text="Hello world", error="Stopped")


def test_an_agent_in_text_mode_told_of_a_failure_only_by_its_exit_status():
    assert read_text_output("The quick\n", "noise\n", 0, errors_on_stdout=False) == AgentOutput(text="The quick", error=None)
    assert read_text_output("The\n", "ERROR: gone\n", 1, errors_on_stdout=False).error == "ERROR: gone"
    assert read_text_output("API Error: 500\n", "x\n", 1, errors_on_stdout=True).error == "API Error: 500"


def test_the_last_error_line_is_the_last_line_with_something_on_it():
    assert (
        last_line("codex\nThe quick\nERROR: Reconnecting... 1/5\nERROR: stream disconnected  \n\n")
        == "ERROR: stream disconnected"
    )
    assert last_line(" \n") is None


def test_the_terminal_lists_each_agent_cell_with_its_exit_status_requests_and_last_line():
    cell = {
        "scenario": "cut-after-tokens-hub-close",
        "dialect": "responses",
        "client": "codex",
        "gateway": "direct",
        "cell_id": "c0001",
        "outcome": Outcome.ERROR,
        "tries": 6,
        "report": {"exit_code": 1, "interfaces": ["lo"], "error_message": "ERROR: stream disconnected before completion"},
    }
    result = {"cells": [cell], "scenarios": [], "gateways": ["direct"], "clients": ["codex"], "duration_s": 9}
    lines = render_table(result).splitlines()
    row = lines[lines.index("coding agents (outcome, exit status, requests the worker saw, the agent's last error line):") + 1]
    assert row.split() == [
        *("responses", "direct", "cut-after-tokens-hub-close", "codex", "error", "exit", "1", "6", "requests"),
        *"ERROR: stream disconnected before completion".split(),
    ]


# -- the bridge ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["fin", "reset"])
def test_the_bridge_passes_a_half_close_on_and_keeps_a_reset_a_reset(tmp_path, ending):
    async def body() -> None:
        seen: dict[str, bytes] = {}

        async def upstream(stream: trio.SocketStream) -> None:
            # Read the request to its end (the client's half-close must arrive), then answer.
            request = b""
            while data := await stream.receive_some(65536):
                request += data
            seen["request"] = request
            await stream.send_all(b"partial answer")
            if ending == "reset":
                reset_on_close(stream)
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, upstream, 0)
            upstream_port = listeners[0].socket.getsockname()[1]
            path = tmp_path / "bridge.sock"
            async with open_lab_side(path, "127.0.0.1", upstream_port):
                # The namespace side listens on the gateway's port; here one the kernel picks.
                port = await nursery.start(serve_namespace_side, 0, path)
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await client.send_all(b"the request")
                await client.send_eof()
                received = b""
                try:
                    while data := await client.receive_some(65536):
                        received += data
                    ended = "fin"
                except trio.BrokenResourceError:
                    ended = "reset"
                await client.aclose()
            assert seen["request"] == b"the request"
            assert received == b"partial answer"
            assert ended == ending
            nursery.cancel_scope.cancel()

    run_trio(body, deadline=10)
