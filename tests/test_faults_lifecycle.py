"""The fault commands' lifetimes: signals end them cleanly, a killed parent takes toxiproxy with it,
a port held by another toxiproxy is an error, and a probe never runs through another fault.

Every process here is real (the CLI, toxiproxy-server, the worker); every wait has a deadline, and
no test asserts that something happened fast, only that it happened before the deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from faults import catalog
from faults.child_processes import ChildProcess, start_child, start_trio_child
from faults.probe import capture_response
from faults.toxiproxy_client import Toxic, ToxiproxyClient, ToxiproxyUnavailable
from faults.toxiproxy_server import ToxiproxyServerError, run_toxiproxy_server
from labs.worker import open_worker, parse_settings, response_plan
from tests.fixtures_lab import open_proxy, run_trio
from tests.process_watch import CHAINED_WAITS_TIMEOUT, DEADLINE, is_dead, wait_until
from tests.test_faults_cli import assert_one_line_error, faults_cli

ROOT = Path(__file__).resolve().parent.parent

# Every test runs toxiproxy-server (a module-scoped fixture), the CLI or both.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(CHAINED_WAITS_TIMEOUT)]


def start_cli(*arguments: str) -> ChildProcess:
    return start_child(
        [sys.executable, "-m", "faults", *arguments], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def children_of(pid: int) -> list[int]:
    """Child process ids of `pid` (every thread's), from Linux's /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def started_server(process: ChildProcess) -> tuple[int, int]:
    """Read the server command's first line; return its API port and toxiproxy-server's pid."""
    assert process.stdout is not None and process.stderr is not None, "started with both piped"
    line = process.stdout.readline()
    match = re.match(r"toxiproxy 2\.12\.0 API on http://127\.0\.0\.1:(\d+)", line)
    assert match, (line, process.stderr.read() if process.poll() is not None else "")
    (server_pid,) = children_of(process.pid)
    return int(match.group(1)), server_pid


def stop(process: ChildProcess, number: int = signal.SIGTERM) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(number)
    try:
        rest, _ = process.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return process.returncode, rest


# -- the server command -----------------------------------------------------------------------


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_server_command_stops_toxiproxy_on_a_stop_signal(number):
    process = start_cli("--toxiproxy", "http://127.0.0.1:0", "server", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9")
    try:
        port, server_pid = started_server(process)
        assert "worker" in ToxiproxyClient(port=port, timeout=2).proxies()
    finally:
        code, rest = stop(process, number)

    assert code == 0
    assert rest.splitlines() == [f"toxiproxy on http://127.0.0.1:{port} stopped ({signal.Signals(number).name})"]
    assert is_dead(server_pid)
    with pytest.raises(ToxiproxyUnavailable):
        ToxiproxyClient(port=port, timeout=2).version()


def test_toxiproxy_dies_with_a_killed_server_command():
    # SIGKILL runs no cleanup at all: only the parent-death signal stops toxiproxy-server.
    process = start_cli("--toxiproxy", "http://127.0.0.1:0", "server")
    try:
        port, server_pid = started_server(process)
    finally:
        stop(process, signal.SIGKILL)

    wait_until(lambda: is_dead(server_pid), f"toxiproxy-server (pid {server_pid}) dies with its parent")
    with pytest.raises(ToxiproxyUnavailable):
        ToxiproxyClient(port=port, timeout=2).version()


def test_server_command_refuses_a_port_held_by_another_toxiproxy():
    with run_toxiproxy_server() as other:
        result = faults_cli(
            "--toxiproxy", other.url, "server", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", timeout=DEADLINE
        )

        assert_one_line_error(result, f"cannot serve on 127.0.0.1:{other.port}", "address already in use")
        assert result.stdout == ""
        assert other.client.proxies() == {}  # the proxy was not made on the other server either


def test_run_toxiproxy_server_refuses_a_port_held_by_another_toxiproxy():
    with run_toxiproxy_server() as other:
        with pytest.raises(ToxiproxyServerError, match=f"127.0.0.1:{other.port} .*address already in use"):
            with run_toxiproxy_server(port=other.port):
                pytest.fail("started on a port another toxiproxy holds")
        assert other.client.version() == "2.12.0"


def test_the_port_reported_for_port_0_is_the_one_our_process_serves():
    with run_toxiproxy_server() as server:
        assert server.client.version() == "2.12.0"
        os.kill(server.pid, signal.SIGTERM)
        # Stopping our process is what stops the API on the reported port.
        wait_until(lambda: not answers(server.client), f"the API on port {server.port} stops with pid {server.pid}")


def answers(client: ToxiproxyClient) -> bool:
    try:
        client.version()
    except ToxiproxyUnavailable:
        return False
    return True


# -- held faults ------------------------------------------------------------------------------


def test_a_held_fault_is_removed_on_sigterm(toxiproxy):
    toxiproxy.create_proxy("worker", upstream="127.0.0.1:9")
    process = start_cli("--toxiproxy", toxiproxy.url, "latency", "--for", "600")
    try:
        line = process.stdout.readline()
        assert line.startswith("latency on proxy worker:"), line
        assert [t.type for t in toxiproxy.toxics("worker")] == ["latency"]
    finally:
        code, rest = stop(process)

    assert code == 0
    assert rest.splitlines() == ["latency removed (SIGTERM)"]
    assert toxiproxy.toxics("worker") == []


# -- probing through another fault ------------------------------------------------------------


def test_probe_refuses_a_proxy_that_holds_another_commands_fault(toxiproxy):
    # The reviewer's case: a cut held by one command, then a second cut probes through it.
    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            holder = await start_trio_child(
                [sys.executable, "-m", "faults", "--toxiproxy", toxiproxy.url, "cut_after_tokens", "1",
                 "--proxy", proxy.name, "--for", "600"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )  # fmt: skip
            try:
                line = b""
                while b"\n" not in line:
                    chunk = await holder.stdout.receive_some()
                    assert chunk, f"the first command exited early: {line!r}"
                    line += chunk
                second = await trio.to_thread.run_sync(
                    lambda: faults_cli("--toxiproxy", toxiproxy.url, "cut_after_tokens", "2", "--proxy", proxy.name)
                )
            finally:
                holder.send_signal(signal.SIGTERM)
                await holder.wait()
            return proxy.name, second

    name, second = run_trio(scenario)
    assert_one_line_error(
        second, f"proxy {name} has a fault applied already: cut_after_tokens_limit_data (limit_data)", "python -m faults reset"
    )


def test_probe_refuses_a_proxy_that_is_down(toxiproxy):
    toxiproxy.create_proxy("worker", upstream="127.0.0.1:9")
    with catalog.down().applied(toxiproxy, "worker"):
        result = faults_cli("--toxiproxy", toxiproxy.url, "stall_after_tokens", "1")
    assert_one_line_error(result, "proxy worker has a fault applied already: it is down (disabled)", "python -m faults reset")


def test_a_response_cut_short_is_a_connection_error_not_an_h11_error(toxiproxy):
    # A fault applied after the check and before the probe: h11 sees the body end early.
    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            await trio.to_thread.run_sync(
                toxiproxy.add_toxic, proxy.name, Toxic(name="cut", type="limit_data", attributes={"bytes": 300})
            )
            body = {"model": "finishline-worker;tokens=50", "stream": True}
            try:
                await trio.to_thread.run_sync(
                    lambda: capture_response("127.0.0.1", proxy.listen_port, body=body, timeout=DEADLINE)
                )
            except ConnectionError as exc:
                return exc
            pytest.fail("a response cut after 300 bytes was taken for complete")

    error = run_trio(scenario)
    assert "broke off or is not HTTP/1.1" in str(error)
    assert "peer closed connection without sending complete message body" in str(error)


def test_sigterm_while_probing_applies_nothing(toxiproxy):
    # An upstream that holds the second probe's answer until the command has been sent SIGTERM.
    body = {"model": "finishline-worker;tokens=2", "stream": True}
    response = response_plan(parse_settings(body["model"]).for_request(body)).to_bytes()
    second_probe_arrived, signal_sent = trio.Event(), trio.Event()
    probes = 0

    async def upstream(stream: trio.SocketStream) -> None:
        nonlocal probes
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(65536)
        head, _, body_so_far = request.partition(b"\r\n\r\n")
        header = re.search(rb"(?i)content-length: *(\d+)", head)
        assert header is not None, head
        length = int(header.group(1))
        while len(body_so_far) < length:  # read the whole request, or answering early breaks its pipe
            body_so_far += await stream.receive_some(65536)
        probes += 1
        if probes == 2:
            second_probe_arrived.set()
            await signal_sent.wait()
        await stream.send_all(response)
        await stream.aclose()

    async def scenario():
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, upstream, 0, host="127.0.0.1"))
            async with open_proxy(toxiproxy, listener.socket.getsockname()[1]) as proxy:
                process = await start_trio_child(
                    [sys.executable, "-m", "faults", "--toxiproxy", toxiproxy.url, "cut_after_tokens", "1",
                     "--proxy", proxy.name, "--request", json.dumps(body)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                )  # fmt: skip
                await second_probe_arrived.wait()
                process.send_signal(signal.SIGTERM)
                signal_sent.set()
                await process.wait()
                output = b""
                while chunk := await process.stdout.receive_some():
                    output += chunk
                toxics = await trio.to_thread.run_sync(toxiproxy.toxics, proxy.name)
            nursery.cancel_scope.cancel()
        return process.returncode, output.decode(), toxics

    code, output, toxics = run_trio(scenario)
    assert code == 0
    assert output.splitlines() == ["cut_after_tokens not applied (SIGTERM)"]
    assert toxics == []
