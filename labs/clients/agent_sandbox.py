"""One coding agent's run in a network namespace that has only loopback: the child the lab starts
for an agent cell (`python -m labs.clients.agent_sandbox ... -- ARGV...`).

Nothing an agent sends may leave the machine: it may try to reach its vendor for telemetry,
updates or a login. So this process moves itself into a new network namespace (`unshare(2)` with
CLONE_NEWNET, which needs root: the lab checks that before a run starts), where the only interface
is a loopback that starts down; it brings `lo` up (the SIOCSIFFLAGS ioctl: no iproute2 needed),
writes down the interfaces it sees, and listens on 127.0.0.1 at the cell's gateway port, carrying
each connection to the lab's side of the bridge (labs/clients/agent_bridge.py) through a Unix
socket. Then it runs the agent (the one launcher, faults.child_processes), which inherits the
namespace, with its output in two files, until it exits or the deadline passes, and writes a JSON
report: `{"interfaces", "exit_code", "timed_out", "duration_s"}`.

The agent runs in a session of its own, so that when it ends, or is stopped at the deadline or
because this process was told to stop (SIGTERM, SIGINT: the lab stopping, or the launcher's
parent-death signal), what it started goes with it (`os.killpg`), and the namespace then goes away
with this process.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

import trio

from faults.child_processes import start_trio_child
from labs.clients.agent_bridge import serve_namespace_side

__all__ = ["STOP_GRACE_S", "bring_loopback_up", "main"]

#: Seconds between SIGTERM and SIGKILL for an agent past its deadline (an agent that handles
#: SIGTERM prints its last words in them).
STOP_GRACE_S = 2.0
# netdevice(7): read and set an interface's flags; IFF_UP brings it up.
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# struct ifreq: the interface name (IFNAMSIZ 16 bytes), then the flags (a short), padded to 40 bytes.
_IFREQ = "16sH22x"


def bring_loopback_up() -> None:
    """Set IFF_UP on `lo` in this process's network namespace (a new one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _signal_group(pid: int, number: int) -> None:
    try:
        os.killpg(pid, number)
    except ProcessLookupError:
        pass  # the agent and everything it started are gone


async def _cancel_on_signal(scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return


async def _run_agent(arguments: argparse.Namespace) -> tuple[int | None, bool, float]:
    """Serve the bridge, run the agent to its end or its deadline; (exit status, timed out, seconds)."""
    # The deadline, or this process told to stop (the lab stopping, or dying: the launcher's
    # parent-death signal): either way the agent's whole session goes, not just this process. The
    # signals are taken before the agent starts: one that came between its start and a receiver
    # opened after it would end this process at once, and what the agent started would outlive it.
    waiting = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        await nursery.start(_cancel_on_signal, waiting)
        await nursery.start(serve_namespace_side, arguments.port, Path(arguments.bridge))
        with open(arguments.stdout, "wb") as stdout, open(arguments.stderr, "wb") as stderr:
            began = time.monotonic()
            agent = await start_trio_child(
                arguments.argv,
                name=Path(arguments.argv[0]).name,
                stdout=stdout,
                stderr=stderr,
                cwd=arguments.cwd,
                new_session=True,
            )
        status: int | None = None
        waiting.deadline = trio.current_time() + arguments.deadline
        with waiting:
            status = await agent.wait()
        took = time.monotonic() - began
        if status is None:
            _signal_group(agent.pid, signal.SIGTERM)
            with trio.move_on_after(STOP_GRACE_S):
                await agent.wait()
            _signal_group(agent.pid, signal.SIGKILL)
            await agent.wait()
        # What the agent started and left behind (a helper it spawned) ends with it.
        _signal_group(agent.pid, signal.SIGKILL)
        await agent.aclose()
        nursery.cancel_scope.cancel()
    return status, status is None, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.clients.agent_sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the cell's gateway port, served on 127.0.0.1 inside")
    parser.add_argument("--bridge", required=True, help="the lab side's Unix socket (labs.clients.agent_bridge)")
    parser.add_argument("--deadline", type=float, required=True, help="seconds the agent may run")
    parser.add_argument("--stdout", required=True, help="file for the agent's stdout")
    parser.add_argument("--stderr", required=True, help="file for the agent's stderr")
    parser.add_argument("--report", required=True, help="file for the JSON report")
    parser.add_argument("--cwd", required=True, help="the agent's working directory")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- and the agent's command line")
    arguments = parser.parse_args(argv)
    arguments.argv = arguments.argv[1:] if arguments.argv[:1] == ["--"] else arguments.argv
    if not arguments.argv:
        parser.error("no agent command after --")
    os.unshare(os.CLONE_NEWNET)
    bring_loopback_up()
    interfaces = [name for _, name in socket.if_nameindex()]
    status, timed_out, took = trio.run(_run_agent, arguments)
    report = {"interfaces": interfaces, "exit_code": status, "timed_out": timed_out, "duration_s": round(took, 3)}
    Path(arguments.report).write_text(json.dumps(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
