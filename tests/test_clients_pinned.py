"""What each real client does with "reason omitted" and "cut after N tokens", pinned.

Each expectation was read in the library's source (the version below) and is measured here by
running the library (tests/fixtures_chaos.py's small matrix). If a library is upgraded, the version
test fails first: re-read the source named in the comment, then update the pin.

reason omitted (the worker ends with `[DONE]` and never sends a finish_reason):
- openai-python 3.57.0, `_streaming.py` `Stream.__stream__`: breaks at `[DONE]`, never looks at
  finish_reason; the `.stream()` helper (`lib/streaming/chat/_completions.py`) builds the final
  completion with whatever reason came, None included: both `ok`, reason None.
- langchain-openai 1.7.4, `chat_models/base.py` `_convert_chunk_to_generation_chunk`: copies
  finish_reason only when truthy: `ok`, no reason.
- litellm 1.108.7, `litellm_core_utils/streaming_handler.py` `finish_reason_handler`: no reason
  received becomes "stop": `ok`, reason "stop" (1.109+ raise instead, per shared notes).
- httpx-sse 0.4.3 (the baseline reader): `ok`, no reason.
- openai-node 7.59.0, `core/streaming` `Stream`: stops at `[DONE]`: `ok`, null.
- openai-node 7.59.0's `chat.completions.stream()` helper, `lib/ChatCompletionStream.js`
  `finalizeChatCompletion`: a choice whose snapshot has no (truthy) finish_reason throws
  `OpenAIError("missing finish_reason for choice 0")` from `finalChatCompletion()`: `error`.
- @ai-sdk/openai 4.0.118, `dist/index.js` chat `doStream`: finishReason starts as
  {unified: "interrupted"} and only a received finish_reason replaces it: no exception, reason
  "interrupted": `flagged`.
- @ai-sdk/openai-compatible 3.0.92, `dist/index.js` `flush`: no finish reason enqueues an
  `InvalidResponseDataError("Response stream ended without a finish reason.")`: `error`.
- @earendil-works/pi-ai 1.6.0, `dist/api/openai-completions.js`: `compat.supportsFinishReason`
  (default true) and no reason throw "Stream ended without finish_reason": `error`.

cut after 5 tokens (FIN, chunked body without terminator, no `Connection: close`): every client
raises its transport error: openai-python `APIConnectionError` (a `RemoteProtocolError` cause),
LangChain `OpenAIConnectionError`, LiteLLM `MidStreamFallbackError`, httpx `RemoteProtocolError`,
undici `TypeError: terminated` (openai-node as is, its `.stream()` helper re-raised as
`OpenAIError: terminated` with the TypeError as cause (`lib/EventStream.js` `#handleError`), the AI
SDK wrapped in `APICallError`, Pi as an error event "terminated").

The helper differs from the plain openai-node `Stream` wherever the reason is missing: an omitted
`length` (plain: `silent-truncation`), and a cut that Node 20's fetch takes for a complete body
(`Connection: close`; plain: `silent-truncation`) both raise "missing finish_reason for choice 0".
It does not raise on a `length` finish (unlike openai-python's helper): `LengthFinishReasonError`
is thrown only for parse/tool-runner requests (`hasAutoParseableInput`, `_runTools`).

finish_fix's column (client-side, and behind LiteLLM for a few clients): every omitted or empty
reason (`reason-omitted`, `reason-empty`, `tool-calls-omitted`) is `ok` for every client, and every
cut (`cut-during-prefill`, `cut-after-tokens-fin`, `-reset`, `-conn-close`) an `error` whose message
names the interruption ("stream was interrupted", finish_fix's error event). The one by-design
exception: openai-python's `.stream()` helper raises `LengthFinishReasonError` on a repaired
`length` (pinned in the last test).
"""

from __future__ import annotations

import json

import pytest

from faults.child_processes import run_child
from labs.clients import ALL_CLIENTS
from labs.clients.hosts import NODE_PACKAGE
from labs.clients.python_drivers import versions as python_versions

# The first test pays for the small matrix (~45 s here; the fixture itself is bounded at 240 s).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # a backstop: tests/fixtures_chaos.py

# The Messages and Responses clients (tests/test_clients_dialects.py pins what they do): anthropic
# 2.15.0, langchain-anthropic 1.7.10, @anthropic-ai/sdk 1.15.0, @ai-sdk/anthropic 4.0.105; the
# Responses clients are the Chat ones' libraries (openai, langchain-openai, @ai-sdk/openai, pi-ai).
PINNED_VERSIONS = {
    "python": {
        "openai": "3.57.0",
        "langchain-openai": "1.7.4",
        "anthropic": "2.15.0",
        "langchain-anthropic": "1.7.10",
        "litellm": "1.108.7",
        "httpx-sse": "0.4.3",
    },
    "node": {
        "node": "20.20.2",
        "undici": "6.24.1",
        "openai": "7.59.0",
        "@anthropic-ai/sdk": "1.15.0",
        "ai": "7.0.173",
        "@ai-sdk/openai": "4.0.118",
        "@ai-sdk/anthropic": "4.0.105",
        "@ai-sdk/openai-compatible": "3.0.92",
        "@earendil-works/pi-ai": "1.6.0",
        # The Gemini clients (tests/test_clients_gemini_node.py pins what they do); pi-ai's Gemini
        # API runs its own @google/genai.
        "@google/genai": "3.1.0",
        "@ai-sdk/google": "4.0.121",
        "@earendil-works/pi-ai > @google/genai": "2.32.0",
    },
}


def test_the_installed_library_versions_are_the_pinned_ones():
    # What each driver host says in its hello (no matrix needed): the lock files installed these.
    hello = run_child(["node", str(NODE_PACKAGE / "host.mjs")], input="", timeout=60)
    node = json.loads(hello.stdout.splitlines()[0])["hello"]["versions"]
    installed = {"python": python_versions(), "node": node}
    for runtime, pinned in PINNED_VERSIONS.items():
        assert {name: installed[runtime][name] for name in pinned} == pinned


# client: (outcome, surfaced finish_reason or error class, a fragment of the error message)
REASON_OMITTED_DIRECT = {
    "openai-python": ("ok", None, None),
    "openai-python-helper": ("ok", None, None),
    "langchain": ("ok", None, None),
    "litellm-sdk": ("ok", "stop", None),
    "httpx-sse": ("ok", None, None),
    "openai-node": ("ok", None, None),
    "openai-node-helper": ("error", "OpenAIError", "missing finish_reason for choice 0"),
    "ai-sdk-openai": ("flagged", "interrupted", None),
    "ai-sdk-compatible": ("error", "InvalidResponseDataError", "Response stream ended without a finish reason."),
    "pi-ai": ("error", "PiStreamError(error)", "Stream ended without finish_reason"),
}

CUT_AFTER_TOKENS_DIRECT = {
    "openai-python": ("error", "APIConnectionError", "incomplete chunked read"),
    "openai-python-helper": ("error", "APIConnectionError", "incomplete chunked read"),
    "langchain": ("error", "OpenAIConnectionError", "Connection error."),
    "litellm-sdk": ("error", "MidStreamFallbackError", "Connection error"),
    "httpx-sse": ("error", "RemoteProtocolError", "incomplete chunked read"),
    "openai-node": ("error", "TypeError", "terminated"),
    "openai-node-helper": ("error", "OpenAIError", "terminated"),
    "ai-sdk-openai": ("error", "APICallError", "terminated"),
    "ai-sdk-compatible": ("error", "APICallError", "terminated"),
    "pi-ai": ("error", "PiStreamError(error)", "terminated"),
}


def test_the_measured_library_versions_are_the_pinned_ones(small_matrix):
    versions = small_matrix.result["versions"]
    for runtime, pinned in PINNED_VERSIONS.items():
        assert {name: versions[runtime][name] for name in pinned} == pinned


def _check(cell, pin):
    outcome, reason_or_class, message = pin
    report = cell["report"]
    assert cell["outcome"] == outcome, cell["why"]
    if outcome == "ok" or report["completed"]:
        assert report["finish_reason"] == reason_or_class
    else:
        assert report["error_class"] == reason_or_class
        assert message in report["error_message"]


@pytest.mark.parametrize("client", ALL_CLIENTS)
def test_reason_omitted_through_direct(small_matrix, client):
    cell = small_matrix.cell("reason-omitted", client, "direct")
    _check(cell, REASON_OMITTED_DIRECT[client])
    # Whatever the client concluded, it received the whole answer.
    assert cell["report"]["text"] == "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.mark.parametrize("client", ALL_CLIENTS)
def test_cut_after_tokens_through_direct(small_matrix, client):
    cell = small_matrix.cell("cut-after-tokens-fin", client, "direct")
    _check(cell, CUT_AFTER_TOKENS_DIRECT[client])
    assert cell["report"]["text"] == "The quick brown fox jumps"


# Where openai-node's `.stream()` helper and its plain `Stream` part ways (through direct): the
# helper checks the final completion's finish_reason, the plain stream never looks.
NODE_HELPER_DIFFERS = {
    "length-omitted": "silent-truncation",
    "cut-after-tokens-conn-close-direct": "silent-truncation",
}


@pytest.mark.parametrize("scenario", NODE_HELPER_DIFFERS)
def test_the_openai_node_helper_raises_where_the_plain_stream_is_silent(small_matrix, scenario):
    plain = small_matrix.cell(scenario, "openai-node", "direct")
    helper = small_matrix.cell(scenario, "openai-node-helper", "direct")
    assert plain["outcome"] == NODE_HELPER_DIFFERS[scenario], plain["why"]
    assert (helper["outcome"], helper["report"]["error_class"]) == ("error", "OpenAIError"), helper["why"]
    assert helper["report"]["error_message"] == "missing finish_reason for choice 0"
    # Both received the same text; only the helper said it was incomplete.
    assert helper["report"]["text"] == plain["report"]["text"]


@pytest.mark.parametrize("client", ALL_CLIENTS)
def test_finish_fix_turns_an_omitted_reason_into_ok(small_matrix, client):
    cell = small_matrix.cell("reason-omitted", client, "finish_fix")
    assert cell["outcome"] == "ok", cell["why"]


@pytest.mark.parametrize("client", ALL_CLIENTS)
def test_finish_fix_turns_a_cut_into_an_error_that_names_the_interruption(small_matrix, client):
    cell = small_matrix.cell("cut-after-tokens-fin", client, "finish_fix")
    assert cell["outcome"] == "error"
    assert "stream was interrupted" in cell["report"]["error_message"]


@pytest.mark.parametrize("client", ALL_CLIENTS)
def test_finish_fix_restores_length_for_every_client_but_the_parse_helper(small_matrix, client):
    cell = small_matrix.cell("length-omitted", client, "finish_fix")
    if client == "openai-python-helper":
        # lib/_parsing/_completions.py `parse_chat_completion` raises on any `length` finish: the
        # repaired truth is an exception for this helper, by its design.
        assert (cell["outcome"], cell["report"]["error_class"]) == ("error", "LengthFinishReasonError")
    else:
        assert cell["outcome"] == "ok", cell["why"]


# finish_fix's column beyond the two scenarios above: an omitted or empty reason becomes `ok` for
# every client, and every cut becomes an `error` that names the interruption.
FINISH_FIX_OMITTED_REASONS = ("reason-empty", "tool-calls-omitted")
FINISH_FIX_CUTS = ("cut-during-prefill", "cut-after-tokens-reset", "cut-after-tokens-conn-close")


@pytest.mark.parametrize("client", ALL_CLIENTS)
@pytest.mark.parametrize("scenario", FINISH_FIX_OMITTED_REASONS)
def test_finish_fix_turns_every_omitted_or_empty_reason_into_ok(small_matrix, scenario, client):
    cell = small_matrix.cell(scenario, client, "finish_fix")
    assert cell["outcome"] == "ok", cell["why"]


@pytest.mark.parametrize("client", ALL_CLIENTS)
@pytest.mark.parametrize("scenario", FINISH_FIX_CUTS)
def test_finish_fix_turns_every_cut_into_an_error_that_names_the_interruption(small_matrix, scenario, client):
    cell = small_matrix.cell(scenario, client, "finish_fix")
    assert cell["outcome"] == "error", cell["why"]
    assert "stream was interrupted" in cell["report"]["error_message"]


@pytest.mark.parametrize("client", ["openai-python", "httpx-sse", "openai-node"])
def test_finish_fix_behind_litellm_repairs_an_omitted_reason(small_matrix, client):
    cell = small_matrix.cell("reason-omitted-litellm+finish_fix", client, "litellm+finish_fix")
    assert cell["outcome"] == "ok", cell["why"]
    assert cell["books"] == "ok"


@pytest.mark.parametrize("client", ["openai-python", "httpx-sse", "openai-node"])
def test_finish_fix_behind_litellm_turns_a_cut_into_an_error(small_matrix, client):
    cell = small_matrix.cell("cut-after-tokens-fin-litellm+finish_fix", client, "litellm+finish_fix")
    assert cell["outcome"] == "error", cell["why"]
    assert cell["books"] == "error"
