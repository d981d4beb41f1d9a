"""`python -m faults`: bad input is one line and exit 2; live faults apply and are removed."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from faults.child_processes import run_child, start_child, start_trio_child
from faults.toxiproxy_client import ToxiproxyClient, ToxiproxyUnavailable
from labs.worker import WorkerSettings, open_worker, parse_settings, response_plan
from tests.feeding import complete_events
from tests.fixtures_lab import chat_request, client_exchange, open_proxy, run_trio, split_response, token_texts
from tests.process_watch import DEADLINE

ROOT = Path(__file__).resolve().parent.parent

# Every test runs `python -m faults` or the toxiproxy server it drives.
pytestmark = pytest.mark.e2e


def faults_cli(*arguments: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_child([sys.executable, "-m", "faults", *arguments], cwd=ROOT, timeout=timeout)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ")
    for word in words:
        assert word in result.stderr


def test_unknown_fault(toxiproxy_server):
    result = faults_cli("--toxiproxy", toxiproxy_server.url, "cut_after_tokenz", "3")
    assert_one_line_error(result, "unknown fault 'cut_after_tokenz'", "cut_after_tokens", "--help")


def test_negative_n(toxiproxy_server):
    result = faults_cli("--toxiproxy", toxiproxy_server.url, "cut_after_tokens", "-3")
    assert_one_line_error(result, "n must be >= 0 token events, got -3")


def test_n_that_is_not_a_number(toxiproxy_server):
    result = faults_cli("--toxiproxy", toxiproxy_server.url, "stall_after_tokens", "seven")
    assert_one_line_error(result, "n must be a whole number of token events, got 'seven'")


def test_toxiproxy_not_running():
    result = faults_cli("--toxiproxy", f"http://127.0.0.1:{closed_port()}", "down")
    assert_one_line_error(result, "toxiproxy is not running at", "python -m faults server")


def test_unknown_proxy(toxiproxy):
    result = faults_cli("--toxiproxy", toxiproxy.url, "latency", "--proxy", "nope")
    assert_one_line_error(result, "no proxy named 'nope'", "python -m faults proxy")


def test_cut_beyond_the_stream(toxiproxy):
    toxiproxy.create_proxy("worker", upstream="127.0.0.1:9")
    result = faults_cli("--toxiproxy", toxiproxy.url, "cut_after_tokens", "40", "--worker-settings", "tokens=16")
    assert_one_line_error(result, "the stream has 16 token events, cannot cut after 40")


def test_probe_with_no_upstream_says_so(toxiproxy):
    toxiproxy.create_proxy("worker", upstream=f"127.0.0.1:{closed_port()}")
    result = faults_cli("--toxiproxy", toxiproxy.url, "cut_after_tokens", "2")
    assert_one_line_error(result, "cannot probe the stream through proxy worker", "is the upstream running?")


async def run_live_fault(client: ToxiproxyClient, arguments: list[str], body: dict):
    """Start the CLI with a fault, wait for its 'applied' line, send one request, stop the CLI."""
    async with open_worker() as worker, open_proxy(client, worker.port) as proxy:
        process = await start_trio_child(
            [sys.executable, "-m", "faults", "--toxiproxy", client.url, *arguments, "--proxy", proxy.name],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        stdout = process.stdout
        assert stdout is not None  # asked for above
        try:
            output = b""
            while b"\n" not in output:
                chunk = await stdout.receive_some()
                assert chunk, f"the CLI exited early: {output!r}"
                output += chunk
            toxics_while_applied = await trio.to_thread.run_sync(client.toxics, proxy.name)
            received = await client_exchange(proxy.listen_port, chat_request(body))
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()
        while chunk := await stdout.receive_some():
            output += chunk
        toxics_after = await trio.to_thread.run_sync(client.toxics, proxy.name)
        return output.decode(), process.returncode, toxics_while_applied, toxics_after, received


@pytest.mark.parametrize("method", ["probe", "computed"])
def test_live_cut_after_tokens_then_removed_on_sigterm(toxiproxy, method):
    model = "finishline-worker;tokens=12;include_usage=1"
    body = {"model": model, "stream": True}
    arguments = ["cut_after_tokens", "5", "--request", json.dumps(body)]
    if method == "computed":
        arguments += ["--worker-settings", "tokens=12; include_usage=1"]

    output, code, during, after, received = run_trio(run_live_fault, toxiproxy, arguments, body)

    plan = response_plan(parse_settings(model).for_request(body))
    assert code == 0
    assert output.splitlines()[0].startswith("cut_after_tokens on proxy test_")
    assert f"the client gets 5 token events ({plan.offset_after_tokens(5)} bytes), then a FIN" in output
    assert output.splitlines()[-1] == "cut_after_tokens removed (SIGTERM)"
    assert [t.type for t in during] == ["limit_data"]
    assert after == []
    assert received.ending == "fin"
    assert len(token_texts(complete_events(split_response(received.data)[1]))) == 5


def test_live_down_then_removed(toxiproxy):
    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as proxy:
            process = await start_trio_child(
                [sys.executable, "-m", "faults", "--toxiproxy", toxiproxy.url, "down", "--proxy", proxy.name, "--for", "60"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )
            line = await process.stdout.receive_some()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", proxy.listen_port)
            process.send_signal(signal.SIGTERM)
            await process.wait()
            received = await client_exchange(
                proxy.listen_port, chat_request({"model": "m", "stream": True}, headers={"connection": "close"})
            )
            return line.decode(), received

    line, received = run_trio(scenario)
    assert line.startswith("down on proxy test_") and "connections are refused" in line
    assert received.data == response_plan(WorkerSettings().for_request({"model": "m"})).to_bytes()


def test_server_command_runs_toxiproxy_with_a_proxy_and_stops_it():
    port, listen = closed_port(), closed_port()
    process = start_child(
        [sys.executable, "-m", "faults", "--toxiproxy", f"http://127.0.0.1:{port}", "server",
         "--listen", f"127.0.0.1:{listen}", "--upstream", "127.0.0.1:9"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith(
            f"toxiproxy 2.12.0 API on http://127.0.0.1:{port}; proxy worker: 127.0.0.1:{listen} -> 127.0.0.1:9"
        )
        client = ToxiproxyClient(port=port, timeout=2)
        assert client.proxies()["worker"].listen_port == listen
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE) == 0
    with pytest.raises(ToxiproxyUnavailable):
        client.version()
