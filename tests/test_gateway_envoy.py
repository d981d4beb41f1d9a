"""The `envoy` gateway: its static config, its books, and the real Envoy binary in front of real
workers (port 0 everywhere, a deadline on each test).

The retry tests check the operator's failover recipe from Envoy's docs (a spare at priority 1,
`retry_priority: envoy.retry_priorities.previous_priorities`) against what the binary does; the
cells the lab shows for cuts are in tests/test_gateway_envoy_portkey_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from faults.child_processes import free_port
from labs.gateways.envoy import ACCESS_LOG_FORMAT, envoy_books, envoy_bootstrap, open_envoy, read_envoy_books
from labs.gateways.registry import lookup
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.worker import WorkerSettings
from labs.worker.server import open_worker
from tests.feeding import complete_events
from tests.fixtures_lab import chat_request, client_exchange, request_for, run_trio, split_response

PRIMARY = "http://127.0.0.1:18001"
SPARE = "http://127.0.0.1:18002"


def _route(config: dict) -> dict:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]


def _endpoints(config: dict) -> list[dict]:
    return config["static_resources"]["clusters"][0]["load_assignment"]["endpoints"]


def test_every_socket_is_on_loopback_port_0(tmp_path):
    config = envoy_bootstrap(primary_url=PRIMARY, spare_url=None, access_log=tmp_path / "log")
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "127.0.0.1", "port_value": 0}
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 0}


def test_the_route_timeout_is_off_so_long_streams_live(tmp_path):
    # RouteAction.timeout defaults to 15 s for the whole response; 0s disables it.
    assert _route(envoy_bootstrap(primary_url=PRIMARY, spare_url=None, access_log=tmp_path / "log"))["timeout"] == "0s"


def test_one_worker_means_one_endpoint_and_no_retry_policy(tmp_path):
    config = envoy_bootstrap(primary_url=PRIMARY, spare_url=None, access_log=tmp_path / "log")
    assert "retry_policy" not in _route(config)
    assert [e["priority"] for e in _endpoints(config)] == [0]


def test_the_spare_is_the_next_priority_and_the_retry_goes_there(tmp_path):
    config = envoy_bootstrap(primary_url=PRIMARY, spare_url=SPARE, access_log=tmp_path / "log")
    ports = [
        (e["priority"], e["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"]) for e in _endpoints(config)
    ]
    assert ports == [(0, 18001), (1, 18002)]
    policy = _route(config)["retry_policy"]
    assert set(policy["retry_on"].split(",")) == {"5xx", "reset", "connect-failure", "refused-stream"}
    assert policy["retry_priority"]["name"] == "envoy.retry_priorities.previous_priorities"


def test_an_upstream_that_is_not_plain_http_host_port_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"envoy upstream must be http://HOST:PORT, got 'http://127.0.0.1/v1'"):
        envoy_bootstrap(primary_url="http://127.0.0.1/v1", spare_url=None, access_log=tmp_path / "log")


@pytest.mark.parametrize(
    ("code", "flags", "word"),
    [
        (200, "-", BOOKS_OK),
        (200, "UPE", BOOKS_ERROR),  # the body was cut after the head
        (503, "UF", BOOKS_ERROR),  # no connection to the upstream
        (502, "-", BOOKS_ERROR),  # the upstream's own error status
        (200, "DC", BOOKS_ERROR),  # the client left before the end
    ],
)
def test_books_word_from_code_and_flags(code, flags, word):
    assert envoy_books({"response_code": code, "response_flags": flags}) == word


def test_books_are_found_by_the_cell_id_in_the_model():
    entries = [
        {"model": "c0001;tokens=3", "response_code": 200, "response_flags": "-"},
        {"model": "c0002;tokens=3", "response_code": 200, "response_flags": "UPE"},
    ]
    assert read_envoy_books(entries, "c0002") == (BOOKS_ERROR, entries[1])
    assert read_envoy_books(entries, "c0003") == (None, None)


def test_a_gemini_request_is_found_by_the_model_its_path_names():
    # Gemini's body names no model: `json_to_metadata` copies nothing, and Envoy's JSON log writes
    # the missing metadata as null (or `-` in a text format); the path names it, percent-escaped
    # when the client escaped the settings' `;` and `=`.
    entries = [
        {
            "model": None,
            "path": "/v1/models/c0004%3Btokens%3D3:streamGenerateContent?alt=sse",
            "response_code": 200,
            "response_flags": "-",
        },
        {
            "model": "-",
            "path": "/v1beta/models/c0005;tokens=3:streamGenerateContent?alt=sse",
            "response_code": 200,
            "response_flags": "UPE",
        },
        {"model": "c0006;tokens=3", "path": "/v1/chat/completions", "response_code": 200, "response_flags": "-"},
    ]
    assert read_envoy_books(entries, "c0004") == (BOOKS_OK, entries[0])
    assert read_envoy_books(entries, "c0005") == (BOOKS_ERROR, entries[1])
    assert read_envoy_books(entries, "c0006") == (BOOKS_OK, entries[2])
    assert "path" in ACCESS_LOG_FORMAT


def test_the_registry_entry_takes_the_spare_and_reads_envoy_books():
    entry = lookup("envoy")
    assert (entry.books_kind, entry.uses_spare, entry.missing()) == ("envoy", True, None)


# -- the real binary ---------------------------------------------------------------------------


def _read_access_log(path: Path, model: str) -> dict:
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["model"] == model:
            return entry
    raise AssertionError(f"no access-log line for {model!r} in {path}")


async def _wait_for_access_log(path: Path) -> None:
    # Envoy flushes its access log every 100 ms (--file-flush-interval-msec).
    while not path.read_text().strip():
        await trio.sleep(0.05)


async def _read_until_then_hang_up(port: int, request: bytes, marker: bytes) -> list[bytes]:
    """Send `request` on a keep-alive connection, read until `marker` has arrived, then close at
    once, as a client that stops at `[DONE]` does (openai-node, pi-ai). Returns the reads."""
    reads: list[bytes] = []
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(request)
        while marker not in b"".join(reads):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            reads.append(chunk)
    return reads


@pytest.mark.e2e
def test_a_healthy_stream_passes_through_unchanged_and_is_booked(tmp_path):
    body, plan = request_for(WorkerSettings(tokens=4))

    async def scenario():
        async with open_worker() as worker, open_envoy(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as envoy:
            received = await client_exchange(envoy.port, chat_request(body, headers={"connection": "close"}))
            await _wait_for_access_log(envoy.access_log)
            return received, _read_access_log(envoy.access_log, body["model"])

    received, entry = run_trio(scenario)
    head, streamed = split_response(received.data)
    assert head.startswith("HTTP/1.1 200")
    assert streamed == split_response(plan.to_bytes())[1]
    assert (entry["response_code"], entry["response_flags"], entry["attempts"]) == (200, "-", 1)
    assert entry["bytes_sent"] == len(streamed)


@pytest.mark.e2e
def test_without_a_spare_a_refused_connection_is_a_503_before_headers(tmp_path):
    body, _ = request_for(WorkerSettings(tokens=4))
    nobody = f"http://127.0.0.1:{free_port()}"

    async def scenario():
        async with open_envoy(primary_url=nobody, run_dir=tmp_path) as envoy:
            received = await client_exchange(envoy.port, chat_request(body, headers={"connection": "close"}))
            await _wait_for_access_log(envoy.access_log)
            return received, _read_access_log(envoy.access_log, body["model"])

    received, entry = run_trio(scenario)
    head, answer = split_response(received.data)
    assert head.startswith("HTTP/1.1 503")
    assert answer.startswith(b"upstream connect error or disconnect/reset before headers")
    assert (entry["response_flags"], envoy_books(entry)) == ("UF", BOOKS_ERROR)


@pytest.mark.e2e
def test_with_the_spare_a_refused_connection_is_retried_there_and_the_client_gets_everything(tmp_path):
    body, plan = request_for(WorkerSettings(tokens=4))
    nobody = f"http://127.0.0.1:{free_port()}"

    async def scenario():
        async with (
            open_worker() as spare,
            open_envoy(primary_url=nobody, spare_url=f"http://127.0.0.1:{spare.port}", run_dir=tmp_path) as envoy,
        ):
            received = await client_exchange(envoy.port, chat_request(body, headers={"connection": "close"}))
            await _wait_for_access_log(envoy.access_log)
            return received, _read_access_log(envoy.access_log, body["model"]), spare.port

    received, entry, spare_port = run_trio(scenario)
    head, streamed = split_response(received.data)
    assert head.startswith("HTTP/1.1 200")
    assert complete_events(streamed)[-1] == "[DONE]"
    assert streamed == split_response(plan.to_bytes())[1]
    assert (entry["attempts"], entry["upstream_host"], envoy_books(entry)) == (2, f"127.0.0.1:{spare_port}", BOOKS_OK)


# -- `DC`: who closes first (labs/gateways/envoy.py, module docstring) ---------------------------


@pytest.mark.e2e
def test_a_client_that_hangs_up_at_done_is_booked_by_the_end_envoy_already_had(tmp_path):
    # The worker writes `[DONE]` and the chunked terminator at once, so Envoy reads the end with the
    # last event and forwards both in the same write: by the time a client can see `[DONE]` and
    # hang up, the stream has ended in Envoy, and the books are the upstream's 200, not `DC`.
    body, _ = request_for(WorkerSettings(tokens=4))

    async def scenario():
        async with open_worker() as worker, open_envoy(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as envoy:
            reads = await _read_until_then_hang_up(envoy.port, chat_request(body), b"data: [DONE]")
            await _wait_for_access_log(envoy.access_log)
            return reads, _read_access_log(envoy.access_log, body["model"])

    reads, entry = run_trio(scenario)
    assert reads[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert (entry["response_code"], entry["response_flags"], entry["response_code_details"]) == (200, "-", "via_upstream")
    assert envoy_books(entry) == BOOKS_OK


@pytest.mark.e2e
def test_a_client_that_hangs_up_before_the_end_is_booked_dc(tmp_path):
    # The head is out and the worker is in a 20 s prefill when the client leaves: the stream is
    # still open in Envoy, which resets it and flags it `DC` (downstream_remote_disconnect).
    body, _ = request_for(WorkerSettings(tokens=4, prefill_delay=20))

    async def scenario():
        async with open_worker() as worker, open_envoy(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as envoy:
            reads = await _read_until_then_hang_up(envoy.port, chat_request(body), b"\r\n\r\n")
            await _wait_for_access_log(envoy.access_log)
            return reads, _read_access_log(envoy.access_log, body["model"])

    reads, entry = run_trio(scenario)
    assert b"".join(reads).startswith(b"HTTP/1.1 200")
    assert (entry["response_code"], entry["response_flags"], entry["response_code_details"]) == (
        200,
        "DC",
        "downstream_remote_disconnect",
    )
    assert envoy_books(entry) == BOOKS_ERROR
