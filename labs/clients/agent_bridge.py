"""TCP connections carried into a network namespace over a Unix socket, with how they ended.

A coding agent runs in a network namespace of its own that has only loopback
(labs/clients/agent_sandbox.py); the cell's gateway listens on the lab's loopback, which is
another namespace's. A Unix socket's path is reachable from both (they share the file system), so
the bridge has two halves, one on each side:

- inside, `serve_namespace_side` listens on 127.0.0.1 at the gateway's own port, so the agent is
  given the gateway's own URL, and carries each connection it accepts over a Unix connection;
- in the lab, `open_lab_side` accepts those and opens one TCP connection to the gateway for each.

A plain byte pipe would lose how a connection ended: every end would become the end of the Unix
connection. So the Unix connection is a SOCK_SEQPACKET one, whose messages arrive whole, and each
message starts with a tag: `DATA` and the bytes, or `RESET` when this side's TCP peer reset the
connection. A shutdown of the sending side (read as an empty message) is a FIN. On the far side a
clean close stays a clean close, a half-close included (the other direction goes on: an agent that
half-closes after its request still gets the answer), and a reset becomes a reset (SO_LINGER 0,
then close), which is what tells a client a cut from an end.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path

import trio

from labs.worker.server import reset_on_close

__all__ = ["DATA", "RESET", "open_lab_side", "serve_namespace_side", "splice"]

#: A message's tag: the bytes that follow are data.
DATA = b"d"
#: A message's tag: the sender's TCP peer reset the connection; nothing follows.
RESET = b"r"
#: Bytes read from TCP at a time, one message each (well under a Unix socket's send buffer).
_CHUNK = 65536


def _packet_socket() -> trio.socket.SocketType:
    return trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


async def splice(stream: trio.SocketStream, packets: trio.socket.SocketType) -> None:
    """Relay one TCP connection over one packet connection, both ways, until both directions
    ended or either side was reset; closes both."""
    reset = False

    async def tcp_to_packets(cancel_scope: trio.CancelScope) -> None:
        nonlocal reset
        try:
            while data := await stream.receive_some(_CHUNK):
                await packets.send(DATA + data)
        except trio.BrokenResourceError:
            # ECONNRESET from the TCP peer: pass the reset on, and stop both directions.
            with suppress(OSError):
                await packets.send(RESET)
            cancel_scope.cancel()
            return
        except OSError:
            # The far half went away: this connection can only be reset now.
            reset = True
            cancel_scope.cancel()
            return
        with suppress(OSError):
            packets.shutdown(socket.SHUT_WR)  # the peer's FIN, passed on

    async def packets_to_tcp(cancel_scope: trio.CancelScope) -> None:
        nonlocal reset
        while True:
            try:
                message = await packets.recv(_CHUNK + 1)
            except OSError:
                message = RESET  # the far half died without a word: no clean end to give
            if not message:
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_eof()
                return
            if message[:1] == RESET:
                reset = True
                cancel_scope.cancel()
                return
            try:
                await stream.send_all(message[1:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the TCP peer is gone; reading from it says how (tcp_to_packets)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp_to_packets, nursery.cancel_scope)
            nursery.start_soon(packets_to_tcp, nursery.cancel_scope)
    finally:
        if reset:
            reset_on_close(stream)
        packets.close()
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def serve_namespace_side(port: int, path: Path, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on 127.0.0.1:`port` (inside the namespace; 0: one the kernel picks) and carry each
    connection to the lab's side at `path`; `task_status.started(port)` once listening, with the
    port it listens on."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async def carry(stream: trio.SocketStream) -> None:
        packets = _packet_socket()
        try:
            await packets.connect(str(path))
        except OSError:
            packets.close()
            reset_on_close(stream)  # the lab's side is gone: the agent sees a refused exchange
            await stream.aclose()
            return
        await splice(stream, packets)

    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(carry, listeners)


@asynccontextmanager
async def open_lab_side(path: Path, host: str, port: int) -> AsyncIterator[None]:
    """Accept the namespace side's connections at `path` (a Unix socket made here) and splice
    each to a fresh TCP connection to `host`:`port`, until the block ends."""
    listener = _packet_socket()
    await listener.bind(str(path))
    listener.listen()

    async def carry(packets: trio.socket.SocketType) -> None:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            # The gateway refuses: the agent's connection is reset, as a refusal would reach it.
            with suppress(OSError):
                await packets.send(RESET)
            packets.close()
            return
        await splice(stream, packets)

    async def accept(nursery: trio.Nursery) -> None:
        while True:
            packets, _ = await listener.accept()
            nursery.start_soon(partial(carry, packets))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept, nursery)
            yield
            nursery.cancel_scope.cancel()
    finally:
        listener.close()
