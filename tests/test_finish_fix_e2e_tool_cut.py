"""A Messages stream cut INSIDE a `tool_use` block, end to end: what an agent's library hands it
without finish_fix and through it. The topology and the run: tests/e2e_dialects_run.py (the real
worker, toxiproxy tunnel, hub with `on_tunnel_drop = "close"`, mitmdump with finish_fix, the lab's
driver hosts with the real libraries; each request declares the worker's tool, as an agent would).

The worker answers `tokens=2;tool_calls=1`: a text block ("The quick"), then a `tool_use` block
(`get_weather`) whose input comes in five `input_json_delta`s. The tunnel drops after the token
event that leaves the arguments at a chosen prefix (CUTS), so the call's name was sent and only
part of its arguments; the hub then ends the response cleanly.

- Without finish_fix the end is clean, and what each of the 7 Messages clients does with the half
  call is pinned (WITHOUT_FINISH_FIX), each row checked in the library's source (comments there).
- Through finish_fix, after the partial block there is one `event: error` and nothing else (M4:
  no `content_block_stop`, no `message_stop`); every client raises with "stream was interrupted";
  none hands its application the call as a finished one; the ledger says `interrupted`.

Where this differs from shared/notes/dialects.md section 1, column A ("cut inside `tool_use` gives
partially parsed `input` (jiter partial mode)", the anthropic-python `messages.stream()` row), see
`HELPER_INPUT` and `LANGCHAIN_AGGREGATED_ARGS` below.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk

from finishline import Dialect, EventFramer
from labs.clients import LIBRARY_CLIENTS_BY_DIALECT
from labs.worker.answer import TOOL_NAME
from labs.worker.wire import ResponsePlan
from tests.e2e_dialects_run import Phase, Request, Route, RunResult, cut_phase, model_name, plan_for, run_topology

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

MESSAGES = Dialect.MESSAGES
CLIENTS = LIBRARY_CLIENTS_BY_DIALECT[MESSAGES]
#: One text block, then one tool call; slow enough to be a stream.
SETTINGS = "tokens=2;tool_calls=1;token_delay=0.01"
#: Where the tunnel drops, by name: the tool call's arguments as far as they came (the worker's
#: input is `{"city": "Paris", "unit": "celsius"}`). The first leaves a string value open; the
#: second has one complete key/value and the next value open (the two read differently below).
CUTS = {
    "inside-the-first-value": '{"city": "Paris',
    "inside-the-second-value": '{"city": "Paris", "unit": "',
}
INTERRUPTED = "stream was interrupted"
#: Two cut phases, 16 requests each (7 clients on two routes, raw bytes on both): ~30 s alone on a
#: 2-core machine; generous for a shared one.
RUN_DEADLINE_S = 300


# -- the plan: where each cut lands ----------------------------------------------------------------


def _plan() -> ResponsePlan:
    """The worker's plan for this file's requests (every model name is as long: one plan serves all)."""
    return plan_for(MESSAGES, model_name(0, SETTINGS))


def _data(event: bytes) -> dict[str, Any]:
    """The parsed data of one SSE event, framed by the core's framer, as a client frames it."""
    [framed] = EventFramer().receive_data(event)
    assert framed.data is not None, event
    return json.loads(framed.data)


def _tokens_until_arguments(plan: ResponsePlan, arguments: str) -> int:
    """The number of token events after which the tool call's `input_json_delta`s add up to
    `arguments` exactly (the cut for that prefix).

    Raises:
        LookupError: no token event ends there (the worker's deltas changed).
    """
    tokens, sent = 0, ""
    for segment in plan.segments:
        if segment.kind != "token":
            continue
        tokens += 1
        delta = _data(segment.event).get("delta", {})
        if delta.get("type") == "input_json_delta":
            sent += delta["partial_json"]
            if sent == arguments:
                return tokens
    raise LookupError(f"no token event of the worker's stream leaves the arguments at {arguments!r} (they go {sent!r})")


def _events_before_cut(plan: ResponsePlan, tokens: int) -> list[bytes]:
    """The worker's events that the tunnel lets through when it drops after `tokens` token events."""
    offset, events = plan.head_length, []
    for segment in plan.segments:
        if offset >= plan.offset_after_tokens(tokens):
            break
        offset += len(segment.framed)
        events.append(segment.event)
    return events


CUT_TOKENS = {cut: _tokens_until_arguments(_plan(), arguments) for cut, arguments in CUTS.items()}


def _phases() -> list[Phase]:
    phases = []
    for cut, tokens in CUT_TOKENS.items():
        requests = [
            Request(key=f"{cut}/{route}/raw", dialect=MESSAGES, settings=SETTINGS, route=route)
            for route in (Route.HUB, Route.FINISH_FIX_AT_HUB)
        ]
        requests += [
            Request(key=f"{cut}/{route}/{client}", dialect=MESSAGES, settings=SETTINGS, route=route, client=client, tools=True)
            for route in (Route.HUB, Route.FINISH_FIX_AT_HUB)
            for client in CLIENTS
        ]
        phases.append(cut_phase(MESSAGES, SETTINGS, tokens, requests))
    return phases


@pytest.fixture(scope="module")
def run(toxiproxy_server, mitmproxy_confdir, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run_topology(
        _phases(),
        toxiproxy=toxiproxy_server.client,
        confdir=mitmproxy_confdir,
        run_dir=tmp_path_factory.mktemp("e2e-tool-cut"),
        deadline_s=RUN_DEADLINE_S,
    )


# -- reading what came back ------------------------------------------------------------------------


def _body(run: RunResult, key: str) -> bytes:
    response = run.raw[key]
    assert (response.status, response.error) == (200, None), (key, response)
    return response.body


def _bytes_before_cut(run: RunResult, key: str, cut: str) -> bytes:
    return b"".join(_events_before_cut(run.plan(key), CUT_TOKENS[cut]))


def _text_before_cut(run: RunResult, key: str, cut: str) -> str:
    deltas = (_data(e).get("delta", {}) for e in _events_before_cut(run.plan(key), CUT_TOKENS[cut]))
    return "".join(d["text"] for d in deltas if d.get("type") == "text_delta")


def _report(run: RunResult, key: str) -> dict[str, Any]:
    report = run.reports[key]
    assert report.get("timed_out") is False, report
    return report


def _one_ledger_row(run: RunResult, key: str) -> dict[str, Any]:
    rows = run.ledger_rows(key, Route.FINISH_FIX_AT_HUB)
    assert len(rows) == 1, (key, rows, run.mitmdump_logs[Route.FINISH_FIX_AT_HUB][-3000:])
    return rows[0]


# -- the premise: the cut lands inside the tool call, and the hub ends it cleanly ------------------


@pytest.mark.parametrize("cut", CUTS)
def test_the_cut_lands_inside_the_tool_call_and_the_hub_ends_it_cleanly(run, cut):
    key = f"{cut}/{Route.HUB}/raw"
    body = _body(run, key)
    assert body == _bytes_before_cut(run, key, cut)
    events = [_data(e) for e in _events_before_cut(run.plan(key), CUT_TOKENS[cut])]
    # The call's name was sent; its block is open (no content_block_stop for it), and its
    # arguments are the chosen prefix, not yet JSON.
    [start] = [e for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    assert start["content_block"]["name"] == TOOL_NAME
    block = start["index"]
    assert not [e for e in events if e["type"] == "content_block_stop" and e["index"] == block]
    arguments = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    assert arguments == CUTS[cut]
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)
    cut_models = {run.models[k] for k in run.models if k.startswith(f"{cut}/")}
    actions = {(e.upstream_ending, e.action) for e in run.hub_exchanges if e.model in cut_models}
    assert actions == {("fin", "clean_end")}, actions


# -- without finish_fix: what each client hands its application -------------------------------------

#: anthropic-python-helper: `get_final_message()` returns the snapshot, whose tool_use `input` is
#: `jiter.from_json(buffer, partial_mode=True)` of the arguments so far (anthropic 2.15.0
#: `lib/streaming/_messages.py` L500-509; jiter 0.19.0). `partial_mode=True` is not
#: `"trailing-strings"`: an unfinished string value is dropped with its key, so the input holds
#: only the complete key/value pairs. dialects.md's "partially parsed `input`" is incomplete there:
#: cut inside the first value, the application gets `input == {}` (a call with no arguments, not a
#: half one); only a complete pair before the cut survives.
HELPER_INPUT = {
    "inside-the-first-value": {},
    "inside-the-second-value": {"city": "Paris"},
}

#: LangChain: `ChatAnthropic._astream` iterates the raw SDK stream with no end check
#: (langchain-anthropic 1.7.10 `chat_models.py` L2248-2296) and turns each `input_json_delta` into a
#: `tool_call_chunk` with the piece as `args` (L2455-2478), so the chunks carry the partial JSON text
#: as sent. An application that adds the chunks up (the usual `gathered = gathered + chunk`) gets an
#: `AIMessageChunk` whose `tool_calls` are parsed by langchain-core's `parse_partial_json`
#: (langchain-core 1.8.3 `messages/ai.py` L555-565), which CLOSES an open string: a finished-looking
#: call with a truncated value (the worker's "Paris" could have been "Paris, Texas") and, in the
#: second cut, `unit: ""`. Not in dialects.md (its LangChain row says "silent partial AIMessage").
LANGCHAIN_AGGREGATED_ARGS = {
    "inside-the-first-value": {"city": "Paris"},
    "inside-the-second-value": {"city": "Paris", "unit": ""},
}


def _as_sent(cut: str) -> list[dict[str, str]]:
    """The call as the driver collected it from the wire deltas: the name, the arguments so far."""
    return [{"name": TOOL_NAME, "arguments": CUTS[cut]}]


def _without_finish_fix(cut: str) -> dict[str, tuple[bool, str | None, str | None, list[dict[str, str]]]]:
    """(completed, finish reason if completed else error class, a fragment of the error message,
    the tool calls the driver reports) per client, for `cut`, straight at the hub."""
    return {
        # Raw `messages.create(stream=True)`: the iteration just ends at the body's end
        # (anthropic 2.15.0 `_streaming.py` L211-245: no end check), no stop_reason; the driver
        # collected the `input_json_delta` pieces as they came.
        "anthropic-python": (True, None, None, _as_sent(cut)),
        # `messages.stream()` + `get_final_message()`: the snapshot (L96-102), stop_reason None
        # (only a `message_delta` sets it, L536-537), the call's input as HELPER_INPUT says.
        "anthropic-python-helper": (True, None, None, [{"name": TOOL_NAME, "arguments": json.dumps(HELPER_INPUT[cut])}]),
        # Silent; the chunks carry the partial text (see LANGCHAIN_AGGREGATED_ARGS).
        "langchain": (True, None, None, _as_sent(cut)),
        # @anthropic-ai/sdk 1.15.0 raw: `src/core/streaming.ts` L60-93, the iteration ends (`done =
        # true`) whatever came before; the driver collected the deltas as they came.
        "anthropic-node": (True, None, None, _as_sent(cut)),
        # `MessageStream.finalMessage()` rejects: a message is recorded only on `message_stop`
        # (`src/lib/MessageStream.ts` L556-563), so `#getFinalMessage` throws (L384-389). The
        # half input lives only in `currentMessage` (lazily partial-parsed, L699-704).
        "anthropic-node-helper": (False, "AnthropicError", "stream ended without producing a Message with role=assistant", []),
        # @ai-sdk/anthropic 4.0.105: the `tool-call` part is enqueued only at the block's
        # `content_block_stop` (`src/anthropic-language-model.ts` L3028-3130); before it only
        # `tool-input-start`/`tool-input-delta`, which mark output, so the flush's finish is
        # `interrupted` (L3630-3650): no tool call reaches `result.toolCalls`.
        "ai-sdk-anthropic": (True, "interrupted", None, []),
        # @earendil-works/pi-ai 1.6.0: `toolcall_end` only at `content_block_stop` (dist/api/
        # anthropic-messages.js L790-818); the end without `message_stop` throws (L547-549), which
        # becomes its `error` event (L898-903: stopReason "error").
        "pi-ai": (False, "PiStreamError(error)", "Anthropic stream ended before message_stop", []),
    }


CELLS = [(cut, client) for cut in CUTS for client in CLIENTS]
CELL_IDS = [f"{cut}-{client}" for cut, client in CELLS]


@pytest.mark.parametrize(("cut", "client"), CELLS, ids=CELL_IDS)
def test_without_finish_fix_each_client_hands_its_application_what_its_source_says(run, cut, client):
    key = f"{cut}/{Route.HUB}/{client}"
    report = _report(run, key)
    completed, word, fragment, tool_calls = _without_finish_fix(cut)[client]
    assert report["completed"] is completed, report
    assert (report["finish_reason"] if completed else report["error_class"]) == word, report
    assert fragment is None or fragment in report["error_message"], report
    assert report["tool_calls"] == tool_calls, report
    assert report["text"] == _text_before_cut(run, key, cut), report


@pytest.mark.parametrize("cut", CUTS)
def test_without_finish_fix_langchains_added_up_chunks_hold_a_finished_looking_call(run, cut):
    # What the application's `gathered = gathered + chunk` holds: langchain-core's own
    # AIMessageChunk over the tool-call chunk the driver saw (summing chunks concatenates their
    # `args` by index, which is what the driver's sink does).
    [call] = _report(run, f"{cut}/{Route.HUB}/langchain")["tool_calls"]
    gathered = AIMessageChunk(
        content="",
        tool_call_chunks=[
            {"name": call["name"], "args": call["arguments"], "id": None, "index": 1, "type": "tool_call_chunk"},
        ],
    )
    assert [(c["name"], c["args"]) for c in gathered.tool_calls] == [(TOOL_NAME, LANGCHAIN_AGGREGATED_ARGS[cut])]
    assert gathered.invalid_tool_calls == []


# -- through finish_fix: one error event after the partial block, and every client raises ----------


@pytest.mark.parametrize("cut", CUTS)
def test_through_finish_fix_the_open_tool_block_is_followed_by_one_error_event_and_nothing_else(run, cut):
    key = f"{cut}/{Route.FINISH_FIX_AT_HUB}/raw"
    body, before = _body(run, key), _bytes_before_cut(run, key, cut)
    assert body.startswith(before), body
    # M4: no content_block_stop closes the half call (a client would take it as finished), no
    # message_delta, no message_stop: one `event: error`.
    events = EventFramer().receive_data(body[len(before) :])
    assert [(e.event_type, json.loads(e.data)["type"]) for e in events] == [(b"error", "error")], body
    error = json.loads(events[0].data)["error"]
    assert error["type"] == "api_error" and INTERRUPTED in error["message"], error
    assert error["message"].endswith("(finish_fix)"), error
    row = _one_ledger_row(run, key)
    assert (row["verdict"], row["dialect"]) == ("interrupted", "messages"), row


#: Clients whose driver reports a call only once the library calls it finished (a final message's
#: block, the AI SDK's `tool-call` part, pi-ai's `toolcall_end`). The raw readers (anthropic-python,
#: LangChain, anthropic-node) hand the application each `input_json_delta` piece as it comes, so
#: the pieces before the cut were seen; the raise is what tells the application the call is not
#: finished.
REPORTS_FINISHED_CALLS_ONLY = ("anthropic-python-helper", "anthropic-node-helper", "ai-sdk-anthropic", "pi-ai")


@pytest.mark.parametrize(("cut", "client"), CELLS, ids=CELL_IDS)
def test_through_finish_fix_every_client_raises_and_none_hands_over_a_finished_call(run, cut, client):
    # anthropic-python(-helper), LangChain: `APIStatusError` from `_streaming.py` L228-241 (the
    # helper raises inside the iteration, before `get_final_message()`); anthropic-node(-helper):
    # `APIError` (`src/core/streaming.ts` L76-79); the AI SDK: an error part the driver raises
    # (`StreamProviderError`); pi-ai: `throw new Error(sse.data)` (L527-528).
    key = f"{cut}/{Route.FINISH_FIX_AT_HUB}/{client}"
    report = _report(run, key)
    assert report["completed"] is False, report
    assert INTERRUPTED in report["error_message"], report
    expected_calls = [] if client in REPORTS_FINISHED_CALLS_ONLY else _as_sent(cut)
    assert report["tool_calls"] == expected_calls, report
    assert report["text"] == _text_before_cut(run, key, cut), report
    row = _one_ledger_row(run, key)
    assert (row["verdict"], row["dialect"]) == ("interrupted", "messages"), row


def test_every_messages_client_is_in_the_tables():
    for cut in CUTS:
        assert set(_without_finish_fix(cut)) == set(CLIENTS)
    assert set(REPORTS_FINISHED_CALLS_ONLY) < set(CLIENTS)
    assert set(HELPER_INPUT) == set(LANGCHAIN_AGGREGATED_ARGS) == set(CUTS)
