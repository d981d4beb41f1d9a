"""The lab with a real worker: llama.cpp's server (tests/fixtures_llama.py, once per test worker)
behind the lab's front, tunnel, hub and gateways; the judge's truth captured from it.

One small lab run serves the cell tests (`real_matrix`): the control row and a cut after 5 tokens
that the hub hides, in each dialect, through `direct` and `finish_fix`, one client per dialect.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.__main__ import run_and_report
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from labs.worker.llama_cpp import MODEL_FILE, LlamaCppServer, xllamacpp_version
from labs.worker.real import LLAMA_CPP, REAL_WORKER_DIALECTS, RealUpstream, RealWorker, discover_model, open_real_worker
from tests.fixtures_lab import Received, chat_request, client_exchange, run_trio
from tests.upstream_server import Drop, Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: One client per dialect (openai-python speaks Chat and Responses, anthropic-python Messages).
CLIENTS = ("openai-python", "anthropic-python")
#: The module's matrix also runs the AI SDK, whose schema is the strictest of the clients: it fails a
#: Responses stream without the indexes and the `response.created` fields llama.cpp leaves out.
MATRIX_CLIENTS = (*CLIENTS, "ai-sdk-openai")
SCENARIOS = ("healthy", "cut-after-tokens-hub-close")


@pytest.fixture(scope="module")
def real_matrix(llama_cpp: LlamaCppServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    scenarios = tuple(
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("direct", "finish_fix"), agents=False)
        for name in SCENARIOS
    )
    config = LabConfig(
        scenarios=scenarios,
        clients=MATRIX_CLIENTS,
        gateways=("direct", "finish_fix"),
        dialects=REAL_WORKER_DIALECTS,
        results_dir=tmp_path_factory.mktemp("real-lab"),
        worker=llama_cpp.base_url,
    )
    return run_trio(run_lab, config, deadline=240).to_json()


def cell(matrix: dict[str, Any], scenario: str, dialect: Dialect, gateway: str, client: str | None = None) -> dict[str, Any]:
    client = client or ("anthropic-python" if dialect is Dialect.MESSAGES else "openai-python")
    (found,) = [
        c
        for c in matrix["cells"]
        if (c["scenario"], c["dialect"], c["gateway"], c["client"]) == (scenario, dialect, gateway, client)
    ]
    return found


def expected(matrix: dict[str, Any], scenario: str, dialect: Dialect) -> dict[str, Any]:
    (found,) = [s["expected"] for s in matrix["scenarios"] if s["name"] == scenario and s["dialect"] == dialect]
    return found


def test_the_url_workers_model_is_the_one_its_models_route_lists(llama_cpp: LlamaCppServer):
    assert discover_model(llama_cpp.base_url) == llama_cpp.model == MODEL_FILE


def test_the_result_names_the_worker_and_its_model(real_matrix, llama_cpp: LlamaCppServer):
    assert real_matrix["worker"] == {"worker": llama_cpp.base_url, "model": MODEL_FILE}


@pytest.mark.parametrize("dialect", list(REAL_WORKER_DIALECTS), ids=lambda d: d.value)
def test_the_truth_is_the_servers_captured_answer(real_matrix, dialect):
    truth = expected(real_matrix, "healthy", dialect)
    # SmolLM2 ends this prompt on its own, well within the lab's limit, in more tokens than the cut's 5.
    assert truth["text"] and truth["token_events"] > 5
    assert truth["finish_reason"] == {"chat": "stop", "messages": "end_turn", "responses": "completed"}[dialect]
    # The same request in every dialect: the same greedy answer.
    assert truth["text"] == expected(real_matrix, "healthy", Dialect.CHAT)["text"]


@pytest.mark.parametrize("gateway", ["direct", "finish_fix"])
@pytest.mark.parametrize("dialect", list(REAL_WORKER_DIALECTS), ids=lambda d: d.value)
def test_a_healthy_cell_against_the_real_server_is_ok(real_matrix, dialect, gateway):
    found = cell(real_matrix, "healthy", dialect, gateway)
    assert found["outcome"] == "ok", found["why"]
    assert found["report"]["text"] == expected(real_matrix, "healthy", dialect)["text"]
    assert found["answered_by"] == "primary"
    # The front saw the server's first token go by, where the captured answer has it end.
    (attempt,) = [a for a in found["attempts"] if a["at"] == "primary"]
    assert attempt["ended"] == "complete" and attempt["first_token_s"] is not None


@pytest.mark.parametrize("dialect", [Dialect.CHAT, Dialect.RESPONSES], ids=lambda d: d.value)
def test_the_ai_sdk_is_ok_through_finish_fix_and_fails_llama_cpps_responses_snapshot_direct(real_matrix, dialect):
    fixed = cell(real_matrix, "healthy", dialect, "finish_fix", "ai-sdk-openai")
    assert fixed["outcome"] == "ok", fixed["why"]
    assert fixed["report"]["text"] == expected(real_matrix, "healthy", dialect)["text"]
    direct = cell(real_matrix, "healthy", dialect, "direct", "ai-sdk-openai")
    if dialect is Dialect.CHAT:
        assert direct["outcome"] == "ok", direct["why"]
    else:
        # The server's own defect, shown as it is: the SDK's schema wants an `output_index` on the
        # item events and `created_at` and `model` in `response.created`, which llama.cpp leaves out
        # (finish_fix fills them in: rules R7 and R8).
        assert direct["outcome"] == "error" and "Type validation failed" in direct["why"], direct["why"]


@pytest.mark.parametrize("dialect", list(REAL_WORKER_DIALECTS), ids=lambda d: d.value)
def test_a_cut_the_hub_hides_is_silent_direct_and_an_error_through_finish_fix(real_matrix, dialect):
    direct = cell(real_matrix, "cut-after-tokens-hub-close", dialect, "direct")
    truth = expected(real_matrix, "cut-after-tokens-hub-close", dialect)["text"]
    # The client got the server's first 5 tokens, and nothing said the answer was cut.
    assert direct["outcome"] == "silent-truncation", direct["why"]
    assert truth.startswith(direct["report"]["text"]) and 0 < len(direct["report"]["text"]) < len(truth)
    # The hub saw the server's first token go by (where the captured answer has it), then the cut.
    (hub,) = [a for a in direct["attempts"] if a["at"] == "hub"]
    assert hub["first_token_s"] is not None and hub["ended"] == "tunnel_fin"
    fixed = cell(real_matrix, "cut-after-tokens-hub-close", dialect, "finish_fix")
    assert fixed["outcome"] == "error", fixed["why"]
    assert fixed["books"] == "error"


def test_the_run_keeps_the_servers_stream_for_the_report(real_matrix):
    streams = {(s["name"], s["dialect"]): s["worker_stream"] for s in real_matrix["scenarios"]}
    assert "SmolLM2-135M-Instruct" in streams[("healthy", "chat")]
    assert "content_block_delta" in streams[("healthy", "messages")]
    assert Path(real_matrix["run_dir"]).is_dir()


def test_a_run_with_the_llama_cpp_worker_starts_the_server_and_names_it_in_result_json(tmp_path):
    """`--worker llama.cpp` (issue 26): the lab starts llama.cpp's server itself (labs/workers.py),
    and result.json says what ran. Small: one client per dialect, the control row and the hub's hidden
    cut, direct."""
    scenarios = tuple(
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("direct",), agents=False)
        for name in SCENARIOS
    )
    config = LabConfig(
        scenarios=scenarios,
        clients=CLIENTS,
        gateways=("direct",),
        dialects=REAL_WORKER_DIALECTS,
        results_dir=tmp_path,
        worker=LLAMA_CPP,
    )
    assert run_and_report(config, []) == 0
    (written,) = tmp_path.glob("**/result.json")
    result = json.loads(written.read_text())
    facts = result["worker"]
    assert (facts["worker"], facts["model"], facts["model_file"]) == ("llama.cpp", MODEL_FILE, MODEL_FILE)
    assert facts["xllamacpp_version"] == xllamacpp_version()
    assert isinstance(facts["llama_cpp_version"], str) and facts["llama_cpp_version"]
    outcomes = {(cell["scenario"], cell["dialect"]): (cell["outcome"], cell["why"]) for cell in result["cells"]}
    expected_outcomes = {"healthy": "ok", "cut-after-tokens-hub-close": "silent-truncation"}
    assert {key: outcome for key, (outcome, _) in outcomes.items()} == {
        (name, dialect): outcome for name, outcome in expected_outcomes.items() for dialect in REAL_WORKER_DIALECTS
    }, outcomes
    assert (written.parent / "llama.cpp.log").is_file()  # the server the lab started kept its log


def front_request(model: str, dialect: Dialect = Dialect.CHAT) -> bytes:
    """A cell's streamed request to the front, on a connection the client closes after it."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": 4096, "temperature": 1.5}
    body["input" if dialect is Dialect.RESPONSES else "messages"] = [{"role": "user", "content": "Say hello."}]
    path = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}[dialect]
    return chat_request(body, path=path, headers={"connection": "close"})


def test_the_front_resets_a_cells_first_attempt_when_its_settings_say_so_then_serves_it(llama_cpp: LlamaCppServer):
    upstream = RealUpstream(host=llama_cpp.host, port=llama_cpp.port, path="/v1", model=llama_cpp.model, facts=llama_cpp.facts())

    async def body() -> tuple[Received, Received, RealWorker]:
        async with open_real_worker(upstream) as worker:
            worker.max_tokens = 4
            model = "c0007;reset_before_head=1"
            first = await client_exchange(worker.port, front_request(model))
            second = await client_exchange(worker.port, front_request(model))
            return first, second, worker

    first, second, worker = run_trio(body, deadline=120)
    assert (first.ending, first.data) == ("reset", b"")
    assert second.ending == "fin" and second.data.startswith(b"HTTP/1.1 200")
    # The server was asked for its own model, the run's limit, greedy; its head says the connection closes.
    assert b'"model":"SmolLM2-135M-Instruct.Q4_1.gguf"' in second.data and b'"finish_reason":"length"' in second.data
    assert b"Connection: close" in second.data.split(b"\r\n\r\n", 1)[0]
    assert [a.ended for a in worker.attempts] == ["reset", "complete"] and worker.arrivals == ["c0007;reset_before_head=1"]


def test_the_front_refuses_a_late_request_of_a_finished_cell_without_asking_the_server(llama_cpp: LlamaCppServer):
    upstream = RealUpstream(host=llama_cpp.host, port=llama_cpp.port, path="/v1", model=llama_cpp.model, facts={})

    async def body() -> tuple[Received, RealWorker]:
        async with open_real_worker(upstream) as worker:
            worker.current_cells = frozenset({"c0002"})
            return await client_exchange(worker.port, front_request("c0001", Dialect.MESSAGES)), worker

    received, worker = run_trio(body, deadline=60)
    assert received.data.startswith(b"HTTP/1.1 409") and b"not one of the lab's current cells" in received.data
    assert worker.stale_refused == 1 and worker.arrivals == []


# -- a URL server that is not llama.cpp: the front's head and endings -------------------------------


def through_front(port: int, path: str) -> tuple[Received, RealWorker]:
    """One cell's request through the front of the server at 127.0.0.1:`port`, its routes under `path`."""
    upstream = RealUpstream(host="127.0.0.1", port=port, path=path, model="m", facts={})

    async def body() -> tuple[Received, RealWorker]:
        async with open_real_worker(upstream) as worker:
            return await client_exchange(worker.port, front_request("c0001")), worker

    return run_trio(body, deadline=120)


def test_a_head_that_would_keep_the_connection_alive_is_made_to_say_it_closes():
    # The front closes the gateway's connection after the response; a server that does not echo
    # the request's `connection: close` must not make the gateway expect to reuse it (review C2).
    event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    with UpstreamServer() as server:
        prefix = server.route(Script(pieces=[event], headers=[("Connection", "keep-alive"), ("Keep-Alive", "timeout=5")]))
        received, worker = through_front(server.port, f"{prefix}/v1")
    head, _, rest = received.data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    assert lines[0].startswith(b"http/1.1 200") and b"connection: close" in lines
    assert not any(line.startswith((b"keep-alive:", b"connection: keep-alive")) for line in lines)
    assert event in rest and rest.endswith(b"0\r\n\r\n") and received.ending == "fin"
    assert [a.ended for a in worker.attempts] == ["complete"]


def test_a_server_that_closes_before_its_head_is_booked_closed_not_client_gone():
    with UpstreamServer() as server:
        prefix = server.route(Script(drop=Drop.EVERY))
        received, worker = through_front(server.port, f"{prefix}/v1")
    assert (received.data, received.ending) == (b"", "fin")
    assert [(a.ended, a.status) for a in worker.attempts] == [("closed", None)]


@pytest.fixture
def resetting_server() -> Iterator[int]:
    """A server that reads a request and resets the connection, before any byte of an answer."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            data = b""
            while b"\r\n\r\n" not in data and (piece := connection.recv(65536)):
                data += piece
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()  # SO_LINGER 0: a reset

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()


def test_a_server_that_resets_before_its_head_is_booked_reset_and_passed_on_as_one(resetting_server):
    # Review C4: the gateway did not leave, the server reset; the books say so and so does the wire.
    received, worker = through_front(resetting_server, "/v1")
    assert (received.data, received.ending) == (b"", "reset")
    assert [(a.ended, a.status) for a in worker.attempts] == [("reset", None)]


def test_a_gemini_request_is_refused_by_the_front_in_geminis_error_shape():
    # The server behind the front speaks no Gemini: the front answers 404 itself, never asks it.
    with UpstreamServer() as server:
        prefix = server.route(Script(pieces=[b"data: {}\n\n"]))
        upstream = RealUpstream(host="127.0.0.1", port=server.port, path=f"{prefix}/v1", model="m", facts={})
        request = chat_request({"contents": []}, path="/v1beta/models/c0001:streamGenerateContent?alt=sse")

        async def body() -> tuple[Received, RealWorker]:
            async with open_real_worker(upstream) as worker:
                return await client_exchange(worker.port, request), worker

        received, worker = run_trio(body, deadline=60)
        assert not server.requests_under(prefix)
    head, _, rest = received.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404")
    error = json.loads(rest)["error"]
    assert (error["code"], error["status"]) == (404, "NOT_FOUND") and "relays no gemini route" in error["message"]
    assert worker.attempts == [] and worker.arrivals == []
