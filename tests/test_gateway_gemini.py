"""The gateways in Gemini: one small real run (google-genai and openai-python, the real LiteLLM
proxies, Envoy, Portkey, vllm-router, finish_fix's mitmdump, the worker, the tunnel and the hub),
with the cells each gateway's source, or what it was seen to do, says it must have.

Three scenarios: `healthy`, `cut-after-tokens-hub-close` (5 tokens, then the hub ends the body
cleanly: a Gemini stream cut at a frame boundary looks like a clean end) and `reason-omitted` (the
whole answer, its last chunk without `finishReason`). The Gemini rows go through every gateway that
carries Gemini; the Chat rows through `litellm-gemini-bridge`, a Chat client of LiteLLM's `gemini/`
provider whose worker speaks Gemini. Each `+finish_fix` has finish_fix between the gateway and the
worker, where it appends Gemini's error frame to a stream that ended without a `finishReason` (rule
G2: a finish reason is never made up).

What the sources say (LiteLLM 1.108.7 under site-packages/litellm; labs/gateways/ for the others):
- `litellm-gemini-passthrough` (`proxy/pass_through_endpoints/llm_passthrough_endpoints.py`
  `gemini_proxy_route`) and `litellm`'s native Gemini route (`google_genai/streaming_iterator.py`)
  relay the worker's events; neither adds anything at the end. Their logging builds a cost for the
  model and fails on a model LiteLLM's map does not know ("This model isn't mapped yet",
  `proxy/pass_through_endpoints/streaming_handler.py`), so the lab's cells have no books entry.
- `litellm-gemini-bridge`: LiteLLM's Gemini provider makes up `stop` for a stream without a
  `finishReason` (notes/gemini.md section 6); an error frame from finish_fix is raised as
  `ServiceUnavailableError` (`_check_streaming_error`), which the proxy writes as Chat's error event.
- Envoy and Portkey relay bytes; vllm-router's catch-all route drops the query, so the worker
  answers `alt=sse` in the JSON-array form, which google-genai cannot parse as SSE.

What a cell waits on: its client's own end, an error or the cut; never a clock (as in
tests/test_gateway_litellm_dialects.py, whose docstring says why the cells' deadline is a loaded
machine's backstop). The run starts five LiteLLM processes (the shared proxy, and the
pass-through's two variants in each of the two topologies: its upstream is an environment variable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.outcome import BOOKS_NO_ENTRY
from labs.table import render_table
from tests.fixtures_chaos import run_lab_over
from tests.fixtures_lab import CELL_BACKSTOP_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SCENARIOS = ("healthy", "cut-after-tokens-hub-close", "reason-omitted")
PASSTHROUGH = ("litellm-gemini-passthrough", "litellm-gemini-passthrough+finish_fix")
BRIDGE = ("litellm-gemini-bridge", "litellm-gemini-bridge+finish_fix")
#: Every gateway that carries Gemini, and the bridge that answers Chat from it.
GATEWAYS = (
    "direct",
    "litellm",
    "litellm+finish_fix",
    "litellm-chat-bridge",
    "litellm-chat-bridge+finish_fix",
    *BRIDGE,
    *PASSTHROUGH,
    "vllm-router",
    "envoy",
    "portkey",
    "portkey+finish_fix",
)
CLIENTS = ("google-genai", "openai-python")
#: LiteLLM's start (25-90 s on a busy machine) five times over two cores: a backstop.
RUN_DEADLINE_S = 900

Matrix = dict[tuple[str, str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dialects = (Dialect.CHAT, Dialect.GEMINI)
    return run_lab_over(
        SCENARIOS,
        Path(tmp_path_factory.mktemp("gateways-gemini")),
        clients=CLIENTS,
        gateways=GATEWAYS,
        dialects=dialects,
        deadline=RUN_DEADLINE_S,
        jobs=64,
        each={"gateways": GATEWAYS, "dialects": dialects, "deadline_s": CELL_BACKSTOP_S},
    )


@pytest.fixture(scope="module")
def matrix(run) -> Matrix:
    return {(c["scenario"], c["dialect"], c["gateway"]): c for c in run["cells"]}


def gemini(matrix: Matrix, scenario: str, gateway: str) -> dict[str, Any]:
    cell = matrix[(scenario, "gemini", gateway)]
    assert cell["client"] == "google-genai"
    return cell


def chat(matrix: Matrix, scenario: str, gateway: str) -> dict[str, Any]:
    cell = matrix[(scenario, "chat", gateway)]
    assert cell["client"] == "openai-python"
    return cell


def words(matrix: Matrix, gateway: str, dialect: Dialect = Dialect.GEMINI) -> dict[str, str]:
    return {scenario: matrix[(scenario, dialect.value, gateway)]["outcome"] for scenario in SCENARIOS}


def test_litellms_gemini_passthrough_relays_a_cut_as_it_came_and_behind_it_finish_fix_makes_it_an_error(matrix):
    # The relay adds nothing: the client sees what it sees direct, a cut or a missing reason
    # taken for the whole answer.
    assert words(matrix, "direct") == {
        "healthy": "ok",
        "cut-after-tokens-hub-close": "silent-truncation",
        "reason-omitted": "silent-truncation",
    }
    assert words(matrix, "litellm-gemini-passthrough") == words(matrix, "direct")
    # finish_fix's error frame passes the relay, and google-genai raises on it.
    assert words(matrix, "litellm-gemini-passthrough+finish_fix") == {
        "healthy": "ok",
        "cut-after-tokens-hub-close": "error",
        "reason-omitted": "error",
    }
    for scenario in SCENARIOS[1:]:
        report = gemini(matrix, scenario, "litellm-gemini-passthrough+finish_fix")["report"]
        assert report["error_class"] == "ServerError"
        assert "stream was interrupted" in report["error_message"]
    # The worker was asked through the pass-through, its path relayed whole (`/v1/models/...`).
    for gateway in PASSTHROUGH:
        assert {a["dialect"] for a in gemini(matrix, "healthy", gateway)["attempts"]} == {"gemini"}


@pytest.mark.parametrize("gateway", [*PASSTHROUGH, "litellm", "litellm+finish_fix"])
def test_litellms_gemini_relays_keep_no_books_for_a_model_its_map_does_not_know(matrix, gateway):
    assert {gemini(matrix, scenario, gateway)["books"] for scenario in SCENARIOS} == {BOOKS_NO_ENTRY}
    assert all(gemini(matrix, scenario, gateway)["books_mismatch"] for scenario in SCENARIOS)


def test_litellms_native_gemini_route_relays_like_the_passthrough(matrix):
    assert words(matrix, "litellm") == words(matrix, "direct")
    assert words(matrix, "litellm+finish_fix") == words(matrix, "litellm-gemini-passthrough+finish_fix")


def test_the_gemini_bridge_makes_up_stop_for_a_cut_and_behind_it_finish_fix_makes_litellm_raise(matrix):
    # LiteLLM's Gemini provider, on a Gemini stream the hub ended cleanly: `stop` and `[DONE]`
    # after 5 tokens, booked a success.
    cut = chat(matrix, "cut-after-tokens-hub-close", "litellm-gemini-bridge")
    assert cut["upstream_dialect"] == "gemini"
    assert {a["dialect"] for a in cut["attempts"]} == {"gemini"}
    assert (cut["outcome"], cut["books"]) == ("silent-truncation", "ok")
    assert cut["report"]["finish_reason"] == "stop"
    assert cut["report"]["text"] == "The quick brown fox jumps"
    # A whole answer without its reason: the made-up `stop` is the true one here by luck.
    assert chat(matrix, "reason-omitted", "litellm-gemini-bridge")["report"]["finish_reason"] == "stop"
    assert words(matrix, "litellm-gemini-bridge", Dialect.CHAT)["reason-omitted"] == "ok"
    # Behind it, finish_fix appends Gemini's error frame to both (never a made-up reason, so the
    # whole answer is an error too); LiteLLM raises on it, writes Chat's error event, books a failure.
    fixed = {scenario: chat(matrix, scenario, "litellm-gemini-bridge+finish_fix") for scenario in SCENARIOS}
    assert {scenario: cell["outcome"] for scenario, cell in fixed.items()} == {
        "healthy": "ok",
        "cut-after-tokens-hub-close": "error",
        "reason-omitted": "error",
    }
    for scenario in SCENARIOS[1:]:
        assert fixed[scenario]["books"] == "error"
        assert "ServiceUnavailableError" in fixed[scenario]["report"]["error_message"]
        assert "stream was interrupted" in fixed[scenario]["report"]["error_message"]


def test_a_gemini_client_of_the_chat_bridge_gets_a_made_up_stop_for_a_cut(matrix):
    # LiteLLM's Gemini adapter in front of a Chat worker: the Chat stream the hub ended cleanly
    # becomes `finishReason: STOP` (any or no reason maps to STOP).
    cut = gemini(matrix, "cut-after-tokens-hub-close", "litellm-chat-bridge")
    assert cut["upstream_dialect"] == "chat"
    assert (cut["outcome"], cut["books"], cut["report"]["finish_reason"]) == ("silent-truncation", "ok", "STOP")
    # Behind it, finish_fix's Chat error event makes LiteLLM raise, and the client raises too: not
    # google-genai's `ServerError` but a `TypeError`. LiteLLM writes its Chat-shaped error frame to
    # the Gemini client (`data: {"error": {"message": ..., "type": null, "param": null, "code":
    # "500"}}`, seen on the wire), and google-genai's `raise_error` compares that string `code`
    # with an int.
    fixed = gemini(matrix, "cut-after-tokens-hub-close", "litellm-chat-bridge+finish_fix")
    assert (fixed["outcome"], fixed["books"], fixed["report"]["error_class"]) == ("error", "error", "TypeError")


@pytest.mark.parametrize("gateway", ["envoy", "portkey"])
def test_envoy_and_portkey_relay_gemini_byte_for_byte_and_book_a_cut_as_a_success(matrix, gateway):
    assert words(matrix, gateway) == words(matrix, "direct")
    # Their books find the cell by the model in the path (a Gemini body names none), and say ok.
    assert {gemini(matrix, scenario, gateway)["books"] for scenario in SCENARIOS} == {"ok"}


def test_behind_portkey_finish_fix_makes_every_gemini_cut_an_error_portkey_books_as_200(matrix):
    assert words(matrix, "portkey+finish_fix") == {
        "healthy": "ok",
        "cut-after-tokens-hub-close": "error",
        "reason-omitted": "error",
    }
    assert {gemini(matrix, scenario, "portkey+finish_fix")["books"] for scenario in SCENARIOS} == {"ok"}


def test_vllm_routers_catch_all_drops_alt_sse_and_google_genai_cannot_read_the_array(matrix):
    assert set(words(matrix, "vllm-router").values()) == {"error"}
    report = gemini(matrix, "healthy", "vllm-router")["report"]
    assert report["error_class"] == "UnknownApiResponseError"
    assert report["error_message"].startswith("Failed to parse response as JSON. Raw response: [{")


def test_the_matrix_names_each_gemini_route(run):
    text = render_table(run)
    assert "gateway: litellm-gemini-bridge  (translated: the worker spoke gemini)" in text
    routes = run["routes"]
    assert routes["litellm-gemini-passthrough"]["gemini"].startswith(
        "LiteLLM: /gemini/{path} through its Google AI Studio pass-through"
    )
    assert routes["litellm"]["gemini"].startswith(
        "LiteLLM: /v1beta/models/{model}:streamGenerateContent through a gemini/ deployment"
    )
    assert routes["litellm-gemini-bridge"]["chat"].startswith("LiteLLM: /v1/chat/completions through its Gemini provider")
