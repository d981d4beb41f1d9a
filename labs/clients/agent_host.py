"""The trio side of the coding agents: one cell, one agent process in a sandbox, one report.

Library clients run in long-lived driver hosts (labs.clients.hosts); an agent is a command its user
runs once per prompt, so each agent cell starts one: `AgentHost.run` takes the same request line a
driver host does and answers with the same kind of record, so the runner treats both alike.

For a cell it makes a temporary folder (the agent's `$HOME` and config directories, and the Unix
socket of the bridge), writes the agent's config (labs.clients.agent_clis), opens the lab's side
of the bridge to the cell's gateway (labs.clients.agent_bridge) and starts
`labs.clients.agent_sandbox`, which runs the agent in a loopback-only network namespace until it
exits or the cell's deadline passes. What stays, in `<run folder>/agents/<cell id>/`: the agent's
stdout and stderr as it printed them, its command line and environment (`command.json`), the
sandbox's report and log.

The record: `completed` when the agent exited 0 and told of no failure, `text` the answer it
printed, `exit_code`, `error_message` its words for the failure it told of (the last line of the
stream its user reads errors on after a non-zero exit; gemini-cli's JSON `error`, which comes with
exit 0 too: labs.clients.agent_output), `interfaces` the network interfaces its namespace had.
`labs.outcome.judge` reads a record with an exit status as a command's (what the user saw: the
exit status, the failure told of and the printed answer).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import trio

from faults.child_processes import ChildStartError, run_child, start_trio_child
from finishline import Dialect
from labs.clients.agent_bridge import open_lab_side
from labs.clients.agent_clis import AGENTS, Agent, AgentCell, agent_versions, missing_agents
from labs.clients.agent_output import last_line

__all__ = ["AGENT_RUNTIME", "UNSHARE_CHECK", "AgentHost", "agent_refusal"]

#: The runtime name of the agents' "host", under which the run reports their versions.
AGENT_RUNTIME = "agents"
#: Seconds the lab waits beyond a cell's deadline for the sandbox to stop its agent and report.
BACKSTOP_GRACE_S = 10.0
#: The error class of a cell whose sandbox wrote no report.
SANDBOX_FAILED = "AgentSandboxFailed"
#: The sandbox's first step, tried in a child before a run with agents: it fails the same way
#: (EPERM) for the same reason.
UNSHARE_CHECK: tuple[str, ...] = (sys.executable, "-c", "import os; os.unshare(os.CLONE_NEWNET)")


def agent_refusal(clients: tuple[str, ...], *, unshare_check: Sequence[str] = UNSHARE_CHECK) -> str | None:
    """Why the agent cells among `clients` cannot run here (not installed, or no network namespace
    may be made: that needs root), as one line; None when they can (or none is an agent).
    `unshare_check`: the command that tries to make one."""
    agents = tuple(client for client in clients if client in AGENTS)
    if not agents:
        return None
    missing = missing_agents(agents)
    if missing is not None:
        return missing
    try:
        check = run_child(unshare_check, timeout=30)
    except subprocess.TimeoutExpired:
        return f"the coding agents ({', '.join(agents)}) need a network namespace of their own, and making one did not finish within 30 s"
    if check.returncode != 0:
        cause = (check.stderr.strip().splitlines() or ["unknown"])[-1]
        return (
            f"the coding agents ({', '.join(agents)}) run in a network namespace of their own, and this process "
            f"may not make one ({cause}): run the lab as root, or leave them out"
        )
    return None


@dataclass(eq=False)
class AgentHost:
    """Runs the agent cells of a run (`open_driver_hosts` makes one when the run has agents)."""

    runtime: ClassVar[str] = AGENT_RUNTIME
    clients: tuple[str, ...]
    #: The run folder; each cell's files go to `agents/<cell id>/` in it.
    run_dir: Path
    hello: dict[str, Any] = field(default_factory=lambda: {"versions": agent_versions()})

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run the request's agent for its cell; return its record (see the module docstring)."""
        agent = AGENTS[request["client"]]
        cell_dir = self.run_dir / "agents" / request["id"]
        cell_dir.mkdir(parents=True, exist_ok=True)
        gateway = urlsplit(request["base_url"])
        host, port = gateway.hostname or "127.0.0.1", gateway.port or 80
        deadline = float(request["deadline_s"])
        prompt = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
        # The agent gets the gateway's own URL: inside its namespace the sandbox listens on
        # 127.0.0.1 at the gateway's port (a gateway elsewhere is reached through that port too).
        inside_url = gateway._replace(netloc=f"127.0.0.1:{port}").geturl()
        # Short and under the system's temp folder: a Unix socket's path must fit in 108 bytes.
        with tempfile.TemporaryDirectory(prefix="finishline-agent-") as temp:
            home = Path(temp)
            cell = AgentCell(
                home=home,
                dialect=Dialect(request.get("dialect", Dialect.CHAT)),
                base_url=inside_url,
                model=request["model"],
                api_key=request["api_key"],
                prompt=prompt,
            )
            command = agent.command(cell)
            (cell_dir / "command.json").write_text(json.dumps({"argv": command.argv, "env": command.env}, indent=1))
            workdir = home / "work"
            workdir.mkdir()
            bridge = home / "gateway.sock"
            argv = [
                sys.executable,
                "-m",
                "labs.clients.agent_sandbox",
                *("--port", str(port), "--bridge", str(bridge), "--deadline", str(deadline), "--cwd", str(workdir)),
                *("--stdout", str(cell_dir / "stdout.txt"), "--stderr", str(cell_dir / "stderr.txt")),
                *("--report", str(cell_dir / "sandbox.json"), "--", *command.argv),
            ]
            async with open_lab_side(bridge, host, port):
                try:
                    sandbox = await start_trio_child(
                        argv, name=f"{agent.name} sandbox", log_path=cell_dir / "sandbox.log", env=command.env
                    )
                except ChildStartError as error:
                    return _failed(request, str(error))
                try:
                    with trio.move_on_after(deadline + BACKSTOP_GRACE_S):
                        await sandbox.wait()
                finally:
                    await sandbox.aclose()  # shielded: a cancelled lab still stops it
        return _record(request, cell_dir, agent)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _failed(request: dict[str, Any], why: str) -> dict[str, Any]:
    return {
        "id": request["id"],
        "client": request["client"],
        "completed": False,
        "error_class": SANDBOX_FAILED,
        "error_message": why,
    }


def _record(request: dict[str, Any], cell_dir: Path, agent: Agent) -> dict[str, Any]:
    try:
        report = json.loads((cell_dir / "sandbox.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log = last_line(_read(cell_dir / "sandbox.log")) or "(nothing)"
        return _failed(request, f"the sandbox wrote no report; its log ({cell_dir / 'sandbox.log'}) ends: {log}")
    stdout, stderr = _read(cell_dir / "stdout.txt"), _read(cell_dir / "stderr.txt")
    status, timed_out = report["exit_code"], report["timed_out"]
    output = agent.read_output(stdout, stderr, status)
    ended_well = status == 0 and not timed_out and output.error is None
    return {
        "id": request["id"],
        "client": request["client"],
        "completed": ended_well,
        "text": output.text,
        "exit_code": status,
        "timed_out": timed_out,
        "error_class": None if ended_well else ("TimeoutError" if timed_out else f"exit status {status}"),
        # The agent's own words, where its user reads them.
        "error_message": None if ended_well else output.error,
        "interfaces": report["interfaces"],
        "duration_s": report["duration_s"],
    }
