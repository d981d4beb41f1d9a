"""The trio side of the driver hosts: start one host process per runtime, send it requests, and
await each outcome by id.

A host answers in completion order; a reader task routes each JSON line to the request waiting for
it. The lab's own backstop deadline sits on top of the driver's: if a host does not answer by then
(a library that ignores its abort signal), the cell is reported as timed out by the lab.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from labs.clients import NODE_CLIENTS, PYTHON_CLIENTS
from labs.processes import ServiceError, terminate

__all__ = ["DriverHost", "NODE_PACKAGE", "open_driver_hosts"]

NODE_PACKAGE = Path(__file__).resolve().parent / "node"
#: Seconds the lab waits beyond a request's own deadline before it stops waiting for the host.
BACKSTOP_GRACE_S = 10.0


@dataclass(eq=False)
class DriverHost:
    runtime: str
    clients: tuple[str, ...]
    process: trio.Process
    hello: dict[str, Any] = field(default_factory=dict)
    _waiting: dict[str, trio.MemorySendChannel] = field(default_factory=dict)
    _send_lock: trio.Lock = field(default_factory=trio.Lock)

    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request, return the host's outcome line (or a lab-side timeout record)."""
        send, receive = trio.open_memory_channel(1)
        self._waiting[request["id"]] = send
        async with self._send_lock:
            await self.process.stdin.send_all((json.dumps(request) + "\n").encode())
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

    async def _read(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        buffered = b""
        started = False
        while True:
            data = await self.process.stdout.receive_some(65536)
            if not data:
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
                    waiter.send_nowait(message)
        if not started:
            raise ServiceError(f"the {self.runtime} driver host exited before saying hello (see its log)")


def _host_argv(runtime: str, clients: tuple[str, ...]) -> list[str]:
    if runtime == "python":
        return [sys.executable, "-m", "labs.clients.python_host", *clients]
    if not (NODE_PACKAGE / "node_modules").is_dir():
        raise ServiceError(f"the Node clients are not installed: run `npm ci` in {NODE_PACKAGE} (or `make setup`)")
    return ["node", str(NODE_PACKAGE / "host.mjs")]


@asynccontextmanager
async def open_driver_hosts(clients: tuple[str, ...], log_dir: Path) -> AsyncIterator[dict[str, DriverHost]]:
    """Start the hosts the given clients need; yields {client name: its host}."""
    wanted = {
        runtime: tuple(c for c in clients if c in names)
        for runtime, names in (("python", PYTHON_CLIENTS), ("node", NODE_CLIENTS))
    }
    hosts: dict[str, DriverHost] = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        processes = []
        try:
            for runtime, names in wanted.items():
                if not names:
                    continue
                with open(log_dir / f"driver-host-{runtime}.log", "ab") as log:
                    process = await trio.lowlevel.open_process(
                        _host_argv(runtime, names), stdin=-1, stdout=-1, stderr=log,
                        env=None,
                    )
                processes.append(process)
                host = DriverHost(runtime=runtime, clients=names, process=process)
                with trio.fail_after(60):
                    await nursery.start(host._read)
                for name in names:
                    hosts[name] = host
            yield hosts
        finally:
            for process in processes:
                with trio.CancelScope(shield=True):
                    try:
                        await process.stdin.aclose()
                    except trio.ClosedResourceError:
                        pass
                    with trio.move_on_after(3):
                        await process.wait()
                    await terminate(process)
            nursery.cancel_scope.cancel()
