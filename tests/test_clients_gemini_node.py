"""The Node clients in Gemini (google-genai-node, ai-sdk-google, pi-ai), run by the lab itself:
the real worker, the real hub and toxiproxy, finish_fix in mitmdump, the lab's outcome judge.

What each library does, measured here and read in its source (the versions pinned in
tests/test_clients_pinned.py; shared/notes/gemini.md sections 3 and 4):

- healthy, and a healthy tool call: every client returns the whole text (the whole call) and the
  reason: @google/genai 3.1.0 candidate 0's `finishReason` as sent (`STOP`), @ai-sdk/google
  4.0.121 its unified `stop`, pi-ai 1.6.0 `stop` (`tool-calls` and `toolUse` after a call).
- reason omitted (reasoning, text, no `finishReason` anywhere), through direct: @google/genai ends
  the iteration with the whole text and no reason (`processStreamResponse` in dist/node/index.mjs
  never looks at one): a `silent-truncation` (Gemini's judge wants a reason, labs.outcome); the AI
  SDK's reason stays at its initial `interrupted` (google-language-model.ts `doStream`), no error
  part: `flagged`; pi-ai throws "Google stream ended without a finish reason"
  (dist/api/google-generative-ai.js L206-208): `error`.
- a cut the hub ends cleanly after 5 token chunks, through direct: the same three words, on a short
  text.
- the tunnel reset after 5 token chunks, through direct: every client raises undici's transport
  error ("terminated").
- through finish_fix (rule G2), the three faults end with finish_fix's `data: {"error": {"code": 503,
  "message": "stream was interrupted: ...", "status": "UNAVAILABLE"}}` frame, which every one of
  them raises on: @google/genai `ApiError` (`throwIfStreamErrorChunk`: a numeric code in 400-599),
  the AI SDK an error part (`StreamProviderError`, message = `error.message`), pi-ai's own
  @google/genai 2.32.0 the same `ApiError`, as an error event.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from faults.child_processes import run_child
from finishline import Dialect
from labs.clients import LAB_API_KEY, NODE_CLIENTS_BY_DIALECT
from labs.clients.hosts import NODE_PACKAGE
from labs.scenario import SCENARIO_DIR, Scenario, load_scenario
from labs.worker.settings import Finish
from tests.fixtures_chaos import Matrix, run_lab_over
from tests.fixtures_lab import CELL_BACKSTOP_S
from tests.gemini_streams import gemini_chunks, sse_body
from tests.upstream_server import Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CLIENTS = NODE_CLIENTS_BY_DIALECT[Dialect.GEMINI]
GATEWAYS = ("direct", "finish_fix")
#: `tool-call` is tool-calls-omitted with its reason sent: a healthy `functionCall` answer (the
#: drivers' tools reach the worker as function declarations, the call comes back whole).
SCENARIOS = ("healthy", "tool-call", "reason-omitted", "cut-after-tokens-hub-close", "cut-after-tokens-reset")
#: The worker's answer for `tokens=12` (labs.worker.answer), and its first 5 tokens.
WHOLE_TEXT = "The quick brown fox jumps over the lazy dog. The quick brown"
CUT_TEXT = "The quick brown fox jumps"
#: finish_fix's message for a stream that ended without a finishReason (its error frame, rule G2).
INTERRUPTED = "stream was interrupted"

#: (outcome, surfaced reason when the client completed or its error class when not, a fragment of
#: the error message)
Pin = tuple[str, str | None, str | None]

SILENT: Pin = ("silent-truncation", None, None)
AI_SDK_INTERRUPTED: Pin = ("flagged", "interrupted", None)
PI_NO_REASON: Pin = ("error", "PiStreamError(error)", "Google stream ended without a finish reason")
DIRECT_WITHOUT_REASON: dict[str, Pin] = {"google-genai-node": SILENT, "ai-sdk-google": AI_SDK_INTERRUPTED, "pi-ai": PI_NO_REASON}
FINISH_FIX_ERROR: dict[str, Pin] = {
    "google-genai-node": ("error", "ApiError", f'got status: UNAVAILABLE. {{"error":{{"code":503,"message":"{INTERRUPTED}'),
    "ai-sdk-google": ("error", "StreamProviderError", INTERRUPTED),
    "pi-ai": ("error", "PiStreamError(error)", f'got status: UNAVAILABLE. {{"error":{{"code":503,"message":"{INTERRUPTED}'),
}
#: The tunnel reset after 5 token chunks, through direct: undici's `TypeError: terminated` (its
#: cause the socket error), wrapped by the AI SDK in `APICallError`, an error event in pi-ai.
RESET_DIRECT: dict[str, Pin] = {
    "google-genai-node": ("error", "TypeError", "terminated"),
    "ai-sdk-google": ("error", "APICallError", "terminated"),
    "pi-ai": ("error", "PiStreamError(error)", "terminated"),
}
TOOL_CALL: dict[str, Pin] = {
    "google-genai-node": ("ok", "STOP", None),
    "ai-sdk-google": ("ok", "tool-calls", None),
    "pi-ai": ("ok", "toolUse", None),
}
HEALTHY: dict[str, Pin] = {
    "google-genai-node": ("ok", "STOP", None),
    "ai-sdk-google": ("ok", "stop", None),
    "pi-ai": ("ok", "stop", None),
}

EXPECTED: dict[tuple[str, str], dict[str, Pin]] = {
    ("healthy", "direct"): HEALTHY,
    ("healthy", "finish_fix"): HEALTHY,
    # A call finishes `STOP`; the AI SDK and pi-ai say `tool-calls` and `toolUse`.
    ("tool-call", "direct"): TOOL_CALL,
    ("tool-call", "finish_fix"): TOOL_CALL,
    ("reason-omitted", "direct"): DIRECT_WITHOUT_REASON,
    ("reason-omitted", "finish_fix"): FINISH_FIX_ERROR,
    ("cut-after-tokens-hub-close", "direct"): DIRECT_WITHOUT_REASON,
    ("cut-after-tokens-hub-close", "finish_fix"): FINISH_FIX_ERROR,
    ("cut-after-tokens-reset", "direct"): RESET_DIRECT,
    ("cut-after-tokens-reset", "finish_fix"): FINISH_FIX_ERROR,
}
#: The text each scenario's client receives, whatever it concludes.
TEXT = {
    "healthy": WHOLE_TEXT,
    "tool-call": "",
    "reason-omitted": WHOLE_TEXT,
    "cut-after-tokens-hub-close": CUT_TEXT,
    "cut-after-tokens-reset": CUT_TEXT,
}

CELLS = [(scenario, gateway, client) for scenario in SCENARIOS for gateway in GATEWAYS for client in CLIENTS]


def test_every_gemini_node_client_has_an_expectation_in_every_cell():
    # The table is the whole matrix: a Node client added to Gemini must be measured here too.
    assert set(CLIENTS) == {"google-genai-node", "ai-sdk-google", "pi-ai"}
    for scenario in SCENARIOS:
        for gateway in GATEWAYS:
            assert set(EXPECTED[(scenario, gateway)]) == set(CLIENTS)


def _scenario(name: str) -> Scenario:
    if name == "tool-call":
        omitted = load_scenario(SCENARIO_DIR / "tool-calls-omitted.toml")
        return dataclasses.replace(omitted, name=name, worker=dataclasses.replace(omitted.worker, finish=Finish.SENT))
    return load_scenario(SCENARIO_DIR / f"{name}.toml")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    """The scenarios in Gemini, through direct and finish_fix, for the Node clients: one lab run."""
    result = run_lab_over(
        map(_scenario, SCENARIOS),
        Path(tmp_path_factory.mktemp("lab-results")),
        clients=CLIENTS,
        gateways=GATEWAYS,
        dialects=(Dialect.GEMINI,),
        deadline=300,
        jobs=6,
        # Every scenario ends by itself: its deadline is only a backstop.
        each={"dialects": (Dialect.GEMINI,), "gateways": GATEWAYS, "clients": CLIENTS, "deadline_s": CELL_BACKSTOP_S},
    )
    return Matrix(result)


@pytest.mark.parametrize(("scenario", "gateway", "client"), CELLS, ids=[f"{s}-{g}-{c}" for s, g, c in CELLS])
def test_what_each_gemini_node_client_makes_of_the_stream(matrix, scenario, gateway, client):
    cell = matrix.cell(scenario, client, gateway)
    outcome, reason_or_class, message = EXPECTED[(scenario, gateway)][client]
    report = cell["report"]
    assert cell["outcome"] == outcome, cell["why"]
    if report["completed"]:
        assert report["finish_reason"] == reason_or_class, report
    else:
        assert report["error_class"] == reason_or_class, report
        assert message in report["error_message"], report
    # Whatever the client concluded, the text the worker sent before the end reached the application.
    assert report["text"] == TEXT[scenario], report
    if scenario == "tool-call":
        assert [call["name"] for call in report["tool_calls"]] == ["get_weather"], report


def test_google_genai_node_refuses_a_base_url_without_a_version_in_one_line():
    # @google/genai puts `/<apiVersion>/models/...` after its base URL: a base URL whose last
    # segment is no version cannot be split into the two, and the cell says why (no request sent).
    request = {
        "id": "c0001",
        "client": "google-genai-node",
        "dialect": "gemini",
        "base_url": "http://127.0.0.1:9/gemini",
        "model": "c0001;tokens=3",
        "messages": [{"role": "user", "content": "Say the sentence about the fox."}],
        "deadline_s": 30.0,
        "api_key": LAB_API_KEY,
    }
    host = run_child(["node", str(NODE_PACKAGE / "host.mjs")], input=json.dumps(request) + "\n", timeout=60)
    report = json.loads(host.stdout.splitlines()[1])
    assert (report["completed"], report["error_class"], report["http_status"]) == (False, "Error", None), report
    assert report["error_message"] == (
        "@google/genai appends /<version>/models/... to its base URL; http://127.0.0.1:9/gemini does not end in a version"
    )


@pytest.mark.parametrize(
    ("version", "model", "path"),
    [
        # The worker's and finish_fix's root.
        ("v1", "c0001;tokens=3", "/v1/models/c0001;tokens=3:streamGenerateContent?alt=sse"),
        # LiteLLM's native Gemini route, a `gemini/` deployment: the AI SDK would post
        # `/v1beta/gemini/...` for a name with a `/` if its driver did not put `models/` before it.
        ("v1beta", "gemini/c0001;tokens=3", "/v1beta/models/gemini/c0001;tokens=3:streamGenerateContent?alt=sse"),
    ],
)
def test_every_gemini_node_client_posts_under_the_base_url_it_is_given(version, model, path):
    with UpstreamServer() as upstream:
        prefix = upstream.route(Script(pieces=[sse_body([chunk]) for chunk in gemini_chunks(["The quick", " brown"])]))
        lines = [
            json.dumps(
                {
                    "id": f"c{number:04d}",
                    "client": client,
                    "dialect": "gemini",
                    "base_url": f"{upstream.origin}{prefix}/{version}",
                    "model": model,
                    "messages": [{"role": "user", "content": "Say the sentence about the fox."}],
                    "deadline_s": 30.0,
                    "api_key": LAB_API_KEY,
                }
            )
            for number, client in enumerate(CLIENTS)
        ]
        host = run_child(["node", str(NODE_PACKAGE / "host.mjs")], input="\n".join(lines) + "\n", timeout=60)
        reports = [json.loads(line) for line in host.stdout.splitlines()[1:]]
        assert sorted((r["client"], r["completed"], r["text"]) for r in reports) == sorted(
            (client, True, "The quick brown") for client in CLIENTS
        ), reports
        assert [request.target for request in upstream.requests_under(prefix)] == [prefix + path] * len(CLIENTS)
