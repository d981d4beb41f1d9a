"""The trio side of the driver hosts: start one host process per runtime, send it requests, and
await each outcome by id.

A host answers in completion order; a reader task routes each JSON line to the request waiting for
it. The lab's own backstop deadline sits on top of the driver's: if a live host does not answer by
then (a library that ignores its abort signal), the cell is a hang, which is what it is. A host
that dies (its output ends) fails every request waiting on it at once, and every later one, with a
`DriverHostCrashed` error that quotes the end of its log: a crash is not a hang.
"""

from __future__ import annotations

import json
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
from labs.clients import runtime_of
from labs.clients.agent_host import AgentHost

__all__ = ["DRIVER_HOST_CRASHED", "ClientHost", "DriverHost", "NODE_PACKAGE", "open_driver_hosts"]

#: The error class of a cell whose driver host died under it.
DRIVER_HOST_CRASHED = "DriverHostCrashed"

NODE_PACKAGE = Path(__file__).resolve().parent / "node"
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


#: What runs a client's requests: a library's driver host, or the agents' (one command per cell);
#: both take a request line and answer a record, and name their runtime and versions in `hello`.
ClientHost = DriverHost | AgentHost


def _host_argv(runtime: str, clients: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[str]:
    if runtime == "python":
        # The dialects only choose what the host imports before its hello (python_host.PRELOAD).
        return [
            sys.executable,
            "-m",
            "labs.clients.python_host",
            *(f for d in dialects for f in ("--dialect", d.value)),
            *clients,
        ]
    if not (NODE_PACKAGE / "node_modules").is_dir():
        raise ChildStartError(f"the Node clients are not installed: run `npm ci` in {NODE_PACKAGE} (or `make setup`)")
    return ["node", str(NODE_PACKAGE / "host.mjs")]


@asynccontextmanager
async def open_driver_hosts(
    clients: tuple[str, ...], log_dir: Path, dialects: tuple[Dialect, ...] = (Dialect.CHAT,)
) -> AsyncIterator[dict[str, ClientHost]]:
    """Start the hosts the given clients need (names of any dialect: a name's runtime is the same in
    every dialect, and each request line says its dialect); yields {client name: its host}. The
    coding agents get an `AgentHost`, which starts nothing until a cell runs (each cell's files go
    under `log_dir`, the run folder).
    `dialects`: those the requests will speak, so the Python host imports their libraries before
    its hello (a request in another dialect still runs; its library is imported then).

    Raises:
        LookupError: a name no dialect knows.
    """
    wanted = {runtime: tuple(c for c in clients if runtime_of(c) == runtime) for runtime in ("python", "node")}
    hosts: dict[str, ClientHost] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        processes = []
        try:
            for runtime, names in wanted.items():
                if not names:
                    continue
                log_path = log_dir / f"driver-host-{runtime}.log"
                # stdin and stdout carry the JSON lines; stderr goes to the log.
                process = await start_trio_child(
                    _host_argv(runtime, names, dialects),
                    name=f"{runtime} driver host",
                    log_path=log_path,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                processes.append(process)
                host = DriverHost(runtime=runtime, clients=names, process=process, log_path=log_path)
                # Its hello, or its exit (`_read` raises then); the deadline is only a backstop.
                with trio.fail_after(START_DEADLINE_S):
                    await nursery.start(host._read)
                for name in names:
                    hosts[name] = host
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
