"""The trio side of the driver hosts: start one host process per runtime, send it requests, and
await each outcome by id.

The runtimes: `python` (the lab's environment), `node`, and each Python environment of its own
(labs.clients.OWN_ENVIRONMENTS: `langchain-google`, LangChain's Gemini model), whose host is the
same Python host started from that environment's interpreter, with this checkout on its path. A
client whose dialects run in different runtimes gets a `SplitHost`, which sends each request to its
dialect's host.

A host answers in completion order; a reader task routes each JSON line to the request waiting for
it. The lab's own backstop deadline sits on top of the driver's: if a live host does not answer by
then (a library that ignores its abort signal), the cell is a hang, which is what it is. A host
that dies (its output ends) fails every request waiting on it at once, and every later one, with a
`DriverHostCrashed` error that quotes the end of its log: a crash is not a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from faults.child_processes import START_DEADLINE_S, ChildStartError, TrioChildProcess, start_trio_child
from finishline import Dialect
from labs.clients import OWN_ENVIRONMENTS, runtime_of
from labs.clients.agent_host import AgentHost
from labs.own_environments import TOOLS, missing_environment

__all__ = [
    "CLIENT_ENVS",
    "DRIVER_HOST_CRASHED",
    "ClientHost",
    "DriverHost",
    "NODE_PACKAGE",
    "SplitHost",
    "host_versions",
    "missing_client_env",
    "open_driver_hosts",
]

#: The error class of a cell whose driver host died under it.
DRIVER_HOST_CRASHED = "DriverHostCrashed"

NODE_PACKAGE = Path(__file__).resolve().parent / "node"
#: The checkout: an environment of its own imports the lab's modules (`labs`, and `finishline` from
#: `addons/`) from here, as source, and nothing from the lab's environment.
CHECKOUT = Path(__file__).resolve().parents[2]
#: Where `make setup` installs the client environments of their own (Makefile `CLIENT_ENVS`), each
#: from `labs/clients/requirements/NAME.txt`.
CLIENT_ENVS = TOOLS / "clients"
CLIENT_REQUIREMENTS = Path(__file__).resolve().parent / "requirements"
#: What each environment of its own (labs.clients.OWN_ENVIRONMENTS) is for: the pin its install check names.
CLIENT_ENV_PINS: dict[str, str] = {"langchain-google": "langchain-google-genai==4.4.2"}
#: Seconds the lab waits beyond a request's own deadline before it stops waiting for the host.
BACKSTOP_GRACE_S = 10.0


@dataclass(eq=False)
class DriverHost:
    runtime: str
    clients: tuple[str, ...]
    process: TrioChildProcess
    log_path: Path | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    #: Set when the host's output ended: why, for every request from then on.
    crashed: str | None = None
    _waiting: dict[str, tuple[dict[str, Any], trio.MemorySendChannel]] = field(default_factory=dict)
    _send_lock: trio.Lock = field(default_factory=trio.Lock)

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request, return the host's outcome line, a `DriverHostCrashed` error record
        if the host died, or a lab-side timeout record if a live host never answered."""
        if self.crashed is not None:
            return self._crash_record(request)
        send, receive = trio.open_memory_channel(1)
        self._waiting[request["id"]] = (request, send)
        stdin = self.process.stdin
        assert stdin is not None, "a driver host is started with stdin=PIPE (open_driver_hosts)"
        try:
            async with self._send_lock:
                await stdin.send_all((json.dumps(request) + "\n").encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._waiting.pop(request["id"], None)
            self.crashed = self.crashed or "its stdin is closed"
            return self._crash_record(request)
        with trio.move_on_after(float(request["deadline_s"]) + BACKSTOP_GRACE_S):
            return await receive.receive()
        self._waiting.pop(request["id"], None)
        return {
            "id": request["id"],
            "client": request["client"],
            "completed": False,
            "timed_out": True,
            "error_class": "LabBackstop",
            "error_message": f"the {self.runtime} driver host did not answer within the deadline plus {BACKSTOP_GRACE_S} s",
        }

    def _crash_record(self, request: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": request["id"],
            "client": request["client"],
            "completed": False,
            "timed_out": False,
            "error_class": DRIVER_HOST_CRASHED,
            "error_message": f"the {self.runtime} driver host ended ({self.crashed}); its log ({self.log_path}) ends: {self._log_tail()}",
        }

    def _log_tail(self, lines: int = 3) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:] if self.log_path else []
        except OSError:
            tail = []
        return " | ".join(tail) or "(nothing)"

    def _fail_waiters(self) -> None:
        """The host's output ended: every request still waiting gets the crash record now."""
        status = self.process.poll()
        self.crashed = self.crashed or ("exit status " + str(status) if status is not None else "its output ended")
        waiting, self._waiting = self._waiting, {}
        for request, send in waiting.values():
            send.send_nowait(self._crash_record(request))

    async def _read(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        buffered = b""
        started = False
        stdout = self.process.stdout
        assert stdout is not None, "a driver host is started with stdout=PIPE (open_driver_hosts)"
        while True:
            try:
                data = await stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                with trio.move_on_after(1):
                    await self.process.wait()  # so the record can say how it ended
                self._fail_waiters()
                break
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a library printed to stdout: not ours
                if "hello" in message and not started:
                    self.hello = message["hello"]
                    started = True
                    task_status.started()
                    continue
                waiter = self._waiting.pop(message.get("id"), None)
                if waiter is not None:
                    waiter[1].send_nowait(message)
        if not started:
            raise ChildStartError(f"the {self.runtime} driver host exited before saying hello (see its log)")


@dataclass(eq=False)
class SplitHost:
    """The host of a client whose dialects run in different runtimes (`langchain`: its Gemini model
    in an environment of its own): each request goes to the host of its dialect."""

    client: str
    by_dialect: dict[Dialect, DriverHost]

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request's dialect's host's answer (see `DriverHost.run`).

        Raises:
            LookupError: the hosts were not opened for the request's dialect.
        """
        dialect = Dialect(request.get("dialect", Dialect.CHAT))
        host = self.by_dialect.get(dialect)
        if host is None:
            raise LookupError(f"{self.client}'s hosts were opened for {', '.join(self.by_dialect)}, not {dialect}")
        return await host.run(request)


#: What runs a client's requests: a library's driver host (or its dialects' hosts), or the agents'
#: (one command per cell); each takes a request line and answers a record.
ClientHost = DriverHost | SplitHost | AgentHost


def host_versions(hosts: dict[str, ClientHost]) -> dict[str, dict[str, Any]]:
    """The versions each host's hello named, by its runtime (a `SplitHost`'s hosts each under theirs)."""
    distinct = [
        inner for host in hosts.values() for inner in (host.by_dialect.values() if isinstance(host, SplitHost) else (host,))
    ]
    return {host.runtime: host.hello.get("versions", {}) for host in distinct}


def missing_client_env(runtime: str) -> str | None:
    """None when the environment of its own `runtime` names is installed from its current
    requirements; else one line that says what is missing and `make setup`."""
    home = CLIENT_ENVS / runtime
    return missing_environment(home, home / "bin" / "python", CLIENT_REQUIREMENTS / f"{runtime}.txt", CLIENT_ENV_PINS[runtime])


def _host_command(
    runtime: str, clients: tuple[str, ...], dialects: tuple[Dialect, ...]
) -> tuple[list[str], dict[str, str] | None]:
    """The argv and environment (None: the lab's own) of the host of `runtime`."""
    if runtime == "node":
        if not (NODE_PACKAGE / "node_modules").is_dir():
            raise ChildStartError(f"the Node clients are not installed: run `npm ci` in {NODE_PACKAGE} (or `make setup`)")
        return ["node", str(NODE_PACKAGE / "host.mjs")], None
    # The dialects only choose what the host imports before its hello (python_host.PRELOAD).
    arguments = [
        "-m",
        "labs.clients.python_host",
        "--runtime",
        runtime,
        *(f for d in dialects for f in ("--dialect", d.value)),
        *clients,
    ]
    if runtime == "python":
        return [sys.executable, *arguments], None
    # An environment of its own: `-s`, no user site-packages; PYTHONPATH replaced, not extended, so
    # that only the checkout's sources join what the environment holds.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(CHECKOUT), str(CHECKOUT / "addons")))}
    return [str(CLIENT_ENVS / runtime / "bin" / "python"), "-s", *arguments], env


@asynccontextmanager
async def open_driver_hosts(
    clients: tuple[str, ...], log_dir: Path, dialects: tuple[Dialect, ...] = (Dialect.CHAT,)
) -> AsyncIterator[dict[str, ClientHost]]:
    """Start the hosts the given clients need (names of any dialect; each request line says its
    dialect); yields {client name: its host}. A client's runtime is its name's in every dialect but
    where it has an environment of its own (`runtime_of`): a client whose `dialects` run in
    different runtimes gets a `SplitHost`. The coding agents get an `AgentHost`, which starts
    nothing until a cell runs (each cell's files go under `log_dir`, the run folder).
    `dialects`: those the requests will speak, so that each client's hosts for them start, and the
    Python hosts import their libraries before their hello (a request in another dialect of the
    same runtime still runs; its library is imported then).

    Raises:
        LookupError: a name no dialect knows.
        ChildStartError: an environment of its own that a client needs is not installed (one line,
            before any host starts), or a host did not start.
    """
    # No dialect: each name's own runtime.
    runtimes = {
        client: tuple(dict.fromkeys(runtime_of(client, dialect) for dialect in dialects or (None,))) for client in clients
    }
    wanted = {
        runtime: tuple(c for c in clients if runtime in runtimes[c])
        for runtime in dict.fromkeys(r for rs in runtimes.values() for r in rs)
        if runtime != "agent"
    }
    missing = [
        f"{', '.join(names)} ({runtime}): {line}"
        for runtime, names in wanted.items()
        if runtime in OWN_ENVIRONMENTS.values() and (line := missing_client_env(runtime))
    ]
    if missing:
        raise ChildStartError("; ".join(missing))
    hosts: dict[str, ClientHost] = {}
    started: dict[str, DriverHost] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        processes = []
        try:
            for runtime, names in wanted.items():
                log_path = log_dir / f"driver-host-{runtime}.log"
                argv, env = _host_command(runtime, names, dialects)
                # stdin and stdout carry the JSON lines; stderr goes to the log.
                process = await start_trio_child(
                    argv, name=f"{runtime} driver host", log_path=log_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
                )
                processes.append(process)
                host = DriverHost(runtime=runtime, clients=names, process=process, log_path=log_path)
                # Its hello, or its exit (`_read` raises then); the deadline is only a backstop.
                with trio.fail_after(START_DEADLINE_S):
                    await nursery.start(host._read)
                started[runtime] = host
            for client, client_runtimes in runtimes.items():
                if client_runtimes == ("agent",):
                    continue
                if len(client_runtimes) == 1:
                    hosts[client] = started[client_runtimes[0]]
                else:
                    hosts[client] = SplitHost(client, {d: started[runtime_of(client, d)] for d in dialects})
            agents = tuple(c for c in clients if runtime_of(c) == "agent")
            if agents:
                agent_host = AgentHost(clients=agents, run_dir=log_dir)
                hosts.update(dict.fromkeys(agents, agent_host))
            yield hosts
        finally:
            for process in processes:
                with trio.CancelScope(shield=True):
                    try:
                        if process.stdin is not None:  # (it is: started with stdin=PIPE above)
                            await process.stdin.aclose()
                    except trio.ClosedResourceError:
                        pass
                    with trio.move_on_after(3):
                        await process.wait()
                    await process.aclose()
            nursery.cancel_scope.cancel()
