"""The `portkey` gateways: the config every request gets, the launcher, the books, and the real
gateway (npm `@portkey-ai/gateway` 1.15.2, labs/gateways/portkey/) in front of real workers and the
real toxiproxy (port 0 everywhere, a deadline on each test).

What the gateway's source (Portkey-AI/gateway v1.15.2) says these tests must see is cited per
test; the cells the lab shows are in tests/test_gateway_envoy_portkey_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from faults import catalog
from faults.child_processes import free_port
from labs.clients import LAB_API_KEY
from labs.gateways.portkey import (
    GEMINI_PROVIDER,
    RETRY_ATTEMPTS,
    open_portkey,
    portkey_books,
    portkey_config,
    read_portkey_books,
)
from labs.gateways.registry import lookup
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.worker import WorkerSettings
from labs.worker.server import open_worker
from tests.feeding import complete_events
from tests.fixtures_lab import (
    chat_request,
    client_exchange,
    open_proxy,
    request_for,
    run_trio,
    split_response,
    token_texts,
)

pytestmark = pytest.mark.e2e

PRIMARY = "http://127.0.0.1:18001"
SPARE = "http://127.0.0.1:18002"
PROMPT = "a prompt the books must not keep"


def _request(settings: WorkerSettings) -> tuple[dict, object]:
    body, plan = request_for(settings)
    return {**body, "messages": [{"role": "user", "content": PROMPT}]}, plan


def test_one_worker_is_one_openai_target_without_retries():
    assert portkey_config(primary_url=PRIMARY, spare_url=None) == {
        "provider": "openai",
        "custom_host": f"{PRIMARY}/v1",
        "api_key": LAB_API_KEY,
    }


def test_with_the_spare_it_falls_back_to_it_after_retrying_the_worker():
    config = portkey_config(primary_url=PRIMARY, spare_url=SPARE)
    assert config["strategy"] == {"mode": "fallback"}
    assert config["retry"] == {"attempts": RETRY_ATTEMPTS}
    assert [target["custom_host"] for target in config["targets"]] == [f"{PRIMARY}/v1", f"{SPARE}/v1"]


@pytest.mark.parametrize(("status", "word"), [(200, BOOKS_OK), (500, BOOKS_ERROR), (502, BOOKS_ERROR), (None, BOOKS_ERROR)])
def test_books_word_is_the_logged_status(status, word):
    assert portkey_books({"status": status}) == word


def test_books_are_found_by_the_cell_id_in_the_model():
    entries = [{"model": "c0001;tokens=3", "status": 200}, {"model": "c0002;tokens=3", "status": 502}]
    assert read_portkey_books(entries, "c0002") == (BOOKS_ERROR, entries[1])
    assert read_portkey_books(entries, "c0009") == (None, None)


def test_a_gemini_request_is_found_by_the_model_in_its_attempts_url():
    # Portkey's log has the request body's model, which a Gemini body does not name.
    entries = [
        {
            "model": None,
            "status": 200,
            "attempts": [{"url": "http://127.0.0.1:9/v1/models/c0004;tokens=3:streamGenerateContent?alt=sse"}],
        },
        {"model": "c0005;tokens=3", "status": 502, "attempts": [{"url": "http://127.0.0.1:9/v1/chat/completions"}]},
    ]
    assert read_portkey_books(entries, "c0004") == (BOOKS_OK, entries[0])
    assert read_portkey_books(entries, "c0005") == (BOOKS_ERROR, entries[1])
    assert read_portkey_books([{"model": None, "status": 200, "attempts": []}], "c0004") == (None, None)


def test_a_gemini_request_gets_the_google_provider_with_the_worker_as_its_custom_host():
    config = portkey_config(primary_url=PRIMARY, spare_url=None, provider=GEMINI_PROVIDER)
    assert config == {"provider": "google", "custom_host": f"{PRIMARY}/v1", "api_key": LAB_API_KEY}


def test_both_registry_entries_take_the_spare_and_keep_portkeys_books():
    for name in ("portkey", "portkey+finish_fix"):
        entry = lookup(name)
        assert (entry.books_kind, entry.uses_spare, entry.missing()) == ("portkey", True, None)


# -- the real gateway ----------------------------------------------------------------------------


def _listening_addresses(port: int) -> set[str]:
    """The local addresses with a TCP socket in LISTEN on `port` (Linux /proc/net/tcp, tcp6)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


async def _entries(path: Path, count: int) -> list[dict]:
    # The gateway logs a request after its handler returned; the launcher appends it.
    while len(path.read_text().splitlines()) < count:
        await trio.sleep(0.05)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_launcher_binds_loopback_only_and_streams_the_worker_unchanged(tmp_path):
    body, plan = _request(WorkerSettings(tokens=4))

    async def scenario():
        async with (
            open_worker() as worker,
            open_portkey(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as portkey,
        ):
            addresses = _listening_addresses(portkey.port)
            received = await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
            return addresses, received, await _entries(portkey.request_log, 1)

    addresses, received, entries = run_trio(scenario)
    assert addresses == {"0100007F"}  # 127.0.0.1, and no other interface
    head, streamed = split_response(received.data)
    assert head.startswith("HTTP/1.1 200")
    # readStream: the openai provider has no stream transformer, events go on as they came.
    assert streamed == split_response(plan.to_bytes())[1]
    [entry] = entries
    assert (entry["model"], entry["status"], entry["stream"]) == (body["model"], 200, True)


def test_a_request_without_portkey_headers_gets_the_lab_config_and_one_with_its_own_keeps_it(tmp_path):
    # The launcher's one job besides the address: the lab's clients send no Portkey headers, so
    # labs/gateways/portkey/serve.mjs adds `x-portkey-config` to the request the gateway's own
    # `fetch` is given (through @hono/node-server 1.13.5's public `serve`, which the gateway's
    # 1.15.2 bundle imports; hooks.mjs hands it ours). If that stops working (a new gateway bundle
    # that no longer imports `serve`, a new @hono/node-server), every lab cell through Portkey
    # would be its 400 "missing config" instead of a stream: this test says so first.
    body, plan = _request(WorkerSettings(tokens=3))

    async def scenario():
        async with open_worker() as worker, open_worker() as other:
            async with open_portkey(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as portkey:
                plain = await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
                # Checked here: a refused request writes no log entry to wait for.
                assert split_response(plain.data)[0].startswith("HTTP/1.1 200"), (
                    f"the launcher's x-portkey-config did not reach the gateway: {plain.data[:300]!r}"
                )
                own_config = json.dumps(portkey_config(primary_url=f"http://127.0.0.1:{other.port}", spare_url=None))
                own = await client_exchange(
                    portkey.port,
                    chat_request(body, headers={"connection": "close", "x-portkey-config": own_config}),
                )
                return plain, own, await _entries(portkey.request_log, 2), worker.port, other.port

    plain, own, entries, worker_port, other_port = run_trio(scenario)
    assert split_response(plain.data)[1] == split_response(plan.to_bytes())[1]
    assert split_response(own.data)[0].startswith("HTTP/1.1 200"), own.data[:300]
    assert [[attempt["url"] for attempt in entry["attempts"]] for entry in entries] == [
        [f"http://127.0.0.1:{worker_port}/v1/chat/completions"],
        [f"http://127.0.0.1:{other_port}/v1/chat/completions"],
    ]


def test_the_books_keep_neither_keys_nor_message_content(tmp_path):
    body, _ = _request(WorkerSettings(tokens=2))

    async def scenario():
        async with (
            open_worker() as worker,
            open_portkey(primary_url=f"http://127.0.0.1:{worker.port}", run_dir=tmp_path) as portkey,
        ):
            await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
            await _entries(portkey.request_log, 1)
            return portkey.request_log.read_text()

    books = run_trio(scenario)
    assert body["model"] in books
    assert LAB_API_KEY not in books and PROMPT not in books


def test_a_cut_after_tokens_becomes_a_clean_end_of_the_body(tmp_path, toxiproxy):
    # handleStreamingMode (src/handlers/streamHandler.ts): the read error is caught and logged, and
    # `writer.close()` ends the body normally: the client gets the chunked terminator after (some
    # of) the five token events, no error and no [DONE]. How many of the five reach the client
    # before the close depends on timing (under load a fresh-clone run got 1), so the count is a
    # range; the clean end and the missing error are what Portkey does every time.
    body, plan = _request(WorkerSettings(tokens=12, token_delay=0.01))

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as tunnel:
            async with open_portkey(primary_url=f"http://127.0.0.1:{tunnel.listen_port}", run_dir=tmp_path) as portkey:
                async with catalog.cut_after_tokens(5, plan).applied(toxiproxy, tunnel.name):
                    received = await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
                return received, await _entries(portkey.request_log, 1)

    received, [entry] = run_trio(scenario)
    head, streamed = split_response(received.data)
    assert head.startswith("HTTP/1.1 200")
    assert received.data.endswith(b"\r\n0\r\n\r\n") and received.ending == "fin"
    events = complete_events(streamed)
    texts = token_texts(events)
    worker_texts = token_texts(complete_events(split_response(plan.to_bytes())[1]))
    assert 1 <= len(texts) <= 5 and texts == worker_texts[: len(texts)] and "[DONE]" not in events
    assert not any("error" in json.loads(event) for event in events)
    assert entry["status"] == 200  # written at the head, before the cut


def test_with_the_spare_a_refused_connection_is_retried_then_falls_back(tmp_path):
    # retryRequest retries a fetch that threw (async-retry: 1 s, then 2 s), then answers 500; the
    # fallback loop moves on from a non-ok answer to the next target, the spare.
    body, plan = _request(WorkerSettings(tokens=4))
    nobody = f"http://127.0.0.1:{free_port()}"

    async def scenario():
        async with (
            open_worker() as spare,
            open_portkey(primary_url=nobody, spare_url=f"http://127.0.0.1:{spare.port}", run_dir=tmp_path) as portkey,
        ):
            received = await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
            return received, await _entries(portkey.request_log, 1), spare.port

    received, [entry], spare_port = run_trio(scenario)
    head, streamed = split_response(received.data)
    assert head.startswith("HTTP/1.1 200")
    assert streamed == split_response(plan.to_bytes())[1]
    assert [attempt["url"] for attempt in entry["attempts"]] == [
        f"{nobody}/v1/chat/completions",
        f"http://127.0.0.1:{spare_port}/v1/chat/completions",
    ]
    assert entry["status"] == 200


def test_without_the_spare_a_refused_connection_is_a_500(tmp_path):
    body, _ = _request(WorkerSettings(tokens=4))
    nobody = f"http://127.0.0.1:{free_port()}"

    async def scenario():
        async with open_portkey(primary_url=nobody, run_dir=tmp_path) as portkey:
            received = await client_exchange(portkey.port, chat_request(body, headers={"connection": "close"}))
            return received, await _entries(portkey.request_log, 1)

    received, [entry] = run_trio(scenario)
    assert split_response(received.data)[0].startswith("HTTP/1.1 500")
    assert (entry["status"], portkey_books(entry)) == (500, BOOKS_ERROR)
