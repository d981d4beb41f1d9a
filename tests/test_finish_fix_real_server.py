"""finish_fix against the REAL llama.cpp server (xllamacpp, SmolLM2-135M: tests/fixtures_llama.py),
through the real mitmdump: what the server gets wrong at a limit, and what the client gets instead.

- Responses, streamed with `max_output_tokens` small: llama.cpp ends `response.completed`, status
  `completed`, and sends no `sequence_number`, `output_index` or `content_index`; openai-python's
  `responses.stream()` helper dies on it with a TypeError. Through finish_fix (rules R6, R7) the
  helper reads the whole stream and its last event is `response.incomplete` with the reason
  `max_output_tokens`; the ledger books both rules. A whole body gets R6 too.
- Responses, streamed: llama.cpp's `response.created` and `response.in_progress` name no `created_at`
  and no `model` (the AI SDK fails the whole stream on that); through finish_fix (rule R8) both come
  from the request, and the ledger books it.
- Messages with a stop sequence: llama.cpp says `end_turn` with the matched `stop_sequence`;
  through finish_fix it is `stop_sequence` (rule M8), streamed and whole.
- Where llama.cpp already says the limit (Chat `length`, Messages `max_tokens`), finish_fix changes
  no reason: the books say `clean`.

Each premise (what llama.cpp itself sends) is asserted straight at the server first, so a llama.cpp
that fixes its own reasons fails these tests loudly instead of passing them for nothing.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from labs.worker.llama_cpp import LlamaCppServer
from tests.e2e_support import openai_client, raw_post
from tests.feeding import data_events
from tests.fixtures_e2e import wait_ledger_rows
from tests.mitmdump_process import Mitmdump, running_finish_fix

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: A limit the answer always reaches (SmolLM2 answers this prompt in tens of tokens).
LIMIT = 8
_SNAPSHOTS = ("response.created", "response.in_progress")
PROMPT = "Tell me about the sun."
#: The model's answer to PROMPT starts "The sun is" (greedy sampling: every run), so a stop at " sun"
#: comes after a token or two.
STOP_SEQUENCE = " sun"


@pytest.fixture(scope="module")
def through(
    llama_cpp: LlamaCppServer, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Mitmdump, Path]]:
    """finish_fix with default options in reverse mode in front of llama.cpp, and its ledger."""
    ledger = tmp_path_factory.mktemp("real-server") / "ledger.jsonl"
    # `keep_host_header`: each request's own Host name marks its ledger line (`_mark`).
    with running_finish_fix(
        confdir=mitmproxy_confdir, upstream_url=llama_cpp.url, ledger=ledger, options={"keep_host_header": "true"}
    ) as mitmdump:
        yield mitmdump, ledger


_MARKS = itertools.count()


def _mark() -> str:
    """A Host name of one request's own. mitmdump keeps it (`keep_host_header`), llama.cpp ignores
    it, and the ledger's URL names it: the request's line is found by it, whatever order the
    flows' lines land in (llama.cpp names no request's model, so the model cannot say whose)."""
    return f"request-{next(_MARKS)}.finishline.test"


def _row(ledger: Path, host: str) -> dict[str, Any]:
    """The one ledger line of the request sent with `host` (written when its flow ends)."""
    [row] = wait_ledger_rows(ledger, lambda row: urlsplit(str(row.get("url", ""))).hostname == host, what=host)
    return row


def _post(base: str, path: str, body: dict[str, Any], host: str | None = None) -> bytes:
    response = raw_post(base + path, body=body, headers={"host": host} if host else None)
    assert (response.status, response.error) == (200, None), response
    return response.body


def _helper_events(base_url: str, model: str, host: str | None = None) -> list[Any]:
    with openai_client(base_url) as client:
        headers = {"host": host} if host else None
        with client.responses.stream(model=model, input=PROMPT, max_output_tokens=LIMIT, extra_headers=headers) as stream:
            return list(stream)


# -- Responses: R6 and R7 ------------------------------------------------------------------------


def test_the_responses_stream_helper_completes_against_llama_cpp_through_finish_fix(llama_cpp, through):
    mitmdump, ledger = through
    with pytest.raises(TypeError, match="list indices must be integers or slices, not NoneType"):
        _helper_events(llama_cpp.base_url, llama_cpp.model)
    host = _mark()
    events = _helper_events(f"{mitmdump.url}/v1", llama_cpp.model, host)
    terminal = events[-1]
    assert terminal.type == "response.incomplete"
    assert terminal.response.status == "incomplete"
    assert terminal.response.incomplete_details is not None
    assert terminal.response.incomplete_details.reason == "max_output_tokens"
    assert terminal.response.usage is not None and terminal.response.usage.output_tokens == LIMIT
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta")
    row = _row(ledger, host)
    assert (row["verdict"], row["dialect"]) == ("repaired", "responses"), row
    assert row["repairs"][0] == (
        f"limit reason (R6): 'response.completed' at {LIMIT} output tokens of the request's {LIMIT} sent as 'response.incomplete'"
    ), row
    assert row["repairs"][1].startswith("responses indexes (R7): filled in sequence_number on "), row


def test_the_responses_snapshots_get_their_created_at_and_model_through_finish_fix(llama_cpp, through):
    # The AI SDK's schema requires both in `response.created` and `response.in_progress`, and fails
    # the whole stream without them (rule R8); llama.cpp names them only in `response.completed`.
    mitmdump, ledger = through
    body = {"model": llama_cpp.model, "input": PROMPT, "max_output_tokens": LIMIT, "stream": True}
    snapshots = [e for e in data_events(_post(llama_cpp.url, "/v1/responses", body)) if e["type"] in _SNAPSHOTS]
    assert [(e["type"], "created_at" in e["response"], "model" in e["response"]) for e in snapshots] == [
        (kind, False, False) for kind in _SNAPSHOTS
    ]  # llama.cpp's omission
    host = _mark()
    sent_at = int(time.time())
    fixed = [e for e in data_events(_post(mitmdump.url, "/v1/responses", body, host)) if e["type"] in _SNAPSHOTS]
    assert [e["response"]["model"] for e in fixed] == [llama_cpp.model] * 2
    assert all(sent_at <= e["response"]["created_at"] <= int(time.time()) for e in fixed), fixed
    assert (
        "responses fields (R8): filled in created_at on 2 events, model on 2 events from the request"
        in _row(ledger, host)["repairs"]
    )


def test_a_whole_responses_body_at_the_limit_is_incomplete_through_finish_fix(llama_cpp, through):
    mitmdump, ledger = through
    body = {"model": llama_cpp.model, "input": PROMPT, "max_output_tokens": LIMIT}
    direct = json.loads(_post(llama_cpp.url, "/v1/responses", body))
    assert (direct["status"], direct["usage"]["output_tokens"]) == ("completed", LIMIT)  # llama.cpp's lie
    host = _mark()
    response = json.loads(_post(mitmdump.url, "/v1/responses", body, host))
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert _row(ledger, host)["verdict"] == "repaired"


# -- Messages: M8's stop sequence ----------------------------------------------------------------


def _stop_sequence_request(model: str, *, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 32,
        "stream": stream,
        "stop_sequences": [STOP_SEQUENCE],
        "messages": [{"role": "user", "content": PROMPT}],
    }


def _message_delta(body: bytes) -> dict[str, Any]:
    [delta] = [event for event in data_events(body) if event.get("type") == "message_delta"]
    return delta


def test_end_turn_at_a_stop_sequence_is_stop_sequence_through_finish_fix(llama_cpp, through):
    mitmdump, ledger = through
    request = _stop_sequence_request(llama_cpp.model, stream=True)
    direct = _message_delta(_post(llama_cpp.url, "/v1/messages", request))
    assert direct["delta"] == {"stop_reason": "end_turn", "stop_sequence": STOP_SEQUENCE}  # llama.cpp's word
    host = _mark()
    body = _post(mitmdump.url, "/v1/messages", request, host)
    assert _message_delta(body)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": STOP_SEQUENCE}
    row = _row(ledger, host)
    assert row["repairs"] == ["stop sequence reason (M8): 'end_turn' with a stop_sequence sent as 'stop_sequence'"], row

    whole = _stop_sequence_request(llama_cpp.model, stream=False)
    assert json.loads(_post(llama_cpp.url, "/v1/messages", whole))["stop_reason"] == "end_turn"
    host = _mark()
    message = json.loads(_post(mitmdump.url, "/v1/messages", whole, host))
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", STOP_SEQUENCE)
    assert _row(ledger, host)["repairs"] == row["repairs"]


# -- where llama.cpp already says the limit ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "extra", "reason_of"),
    [
        (
            "/v1/chat/completions",
            {"max_tokens": LIMIT, "stream_options": {"include_usage": True}},
            lambda events: [
                c["finish_reason"] for e in events if e != "[DONE]" for c in e.get("choices", []) if c["finish_reason"]
            ],
        ),
        (
            "/v1/messages",
            {"max_tokens": LIMIT},
            lambda events: [e["delta"]["stop_reason"] for e in events if e.get("type") == "message_delta"],
        ),
    ],
    ids=["chat", "messages"],
)
def test_a_limit_llama_cpp_reports_itself_is_left_as_it_is(llama_cpp, through, path, extra, reason_of):
    mitmdump, ledger = through
    request = {"model": llama_cpp.model, "stream": True, "messages": [{"role": "user", "content": PROMPT}], **extra}
    host = _mark()
    reasons = reason_of(data_events(_post(mitmdump.url, path, request, host)))
    assert reasons == (["length"] if path.endswith("completions") else ["max_tokens"])
    row = _row(ledger, host)
    assert (row["verdict"], row["repairs"]) == ("clean", []), row
