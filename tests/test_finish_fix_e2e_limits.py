"""Rules C11, M8, R6 and R7 on the wire: the real mitmdump with `-s addons/finish_fix.py` in front
of the simulated worker (`python -m labs.worker`) sending the bytes llama.cpp sends at a token
limit (`hide_limit=1`: `stop`, `end_turn`, `response.completed`; `responses_indexes=0`: no
`sequence_number`, `output_index`, `content_index`), read raw with httpx and by openai-python's
`responses.stream()` helper; the books read from the ledger and a scrape of `/metrics`.

Against llama.cpp itself: tests/test_finish_fix_real_server.py.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from faults.child_processes import START_DEADLINE_S, start_child
from finishline import Dialect
from labs.gateways.finish_fix_scrape import metrics_url_in
from labs.worker import parse_settings, response_plan
from tests.e2e_support import openai_client, raw_post
from tests.feeding import data_events
from tests.fixtures_e2e import wait_ledger_rows
from tests.mitmdump_process import Mitmdump, running_finish_fix
from tests.process_watch import DEADLINE

# Above the waits a test chains (the worker and mitmdump starting, a ledger line: `START_DEADLINE_S`
# each), so a slow machine fails on the wait that names what is missing, not on pytest-timeout.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 4
PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}
LIMIT_KEYS = {Dialect.CHAT: "max_tokens", Dialect.MESSAGES: "max_tokens", Dialect.RESPONSES: "max_output_tokens"}
#: llama.cpp at a limit of 4 out of a 6-token answer.
LLAMA_CPP = "tokens=6;hide_limit=1;responses_indexes=0"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulated worker as its own process; yields its origin once it listens."""
    log = tmp_path_factory.mktemp("limits-worker") / "worker.log"
    with start_child([sys.executable, "-m", "labs.worker", "--port", "0"], cwd=ROOT, log_path=log, name="worker") as process:
        port = process.wait_until_listening(timeout=START_DEADLINE_S)
        yield f"http://127.0.0.1:{port}"


@dataclass(frozen=True)
class Proxy:
    """mitmdump with finish_fix in front of the worker, and its ledger."""

    mitmdump: Mitmdump
    ledger: Path

    def ledger_row(self, model: str) -> dict[str, Any]:
        """The one ledger line of the request that sent `model` (each request sends its own, and
        the worker's answer names it)."""
        [row] = wait_ledger_rows(self.ledger, lambda row: row.get("model") == model, what=model)
        return row


@pytest.fixture(scope="module")
def proxy(worker: str, mitmproxy_confdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """finish_fix with default options (both new ones on) and its metrics, in front of the worker."""
    ledger = tmp_path_factory.mktemp("limits") / "ledger.jsonl"
    with running_finish_fix(
        confdir=mitmproxy_confdir, upstream_url=worker, ledger=ledger, options={"finish_fix_metrics": "127.0.0.1:0"}
    ) as mitmdump:
        yield Proxy(mitmdump=mitmdump, ledger=ledger)


def _request(dialect: Dialect, model: str, *, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": stream, LIMIT_KEYS[dialect]: LIMIT}
    if dialect is Dialect.RESPONSES:
        body["input"] = "Say the sentence about the fox."
    else:
        body["messages"] = [{"role": "user", "content": "Say the sentence about the fox."}]
    if dialect is Dialect.CHAT and stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _worker_body(dialect: Dialect, model: str, *, stream: bool = True) -> bytes:
    settings = parse_settings(model).for_request(_request(dialect, model, stream=stream), dialect)
    return b"".join(segment.event for segment in response_plan(settings, stream=stream, dialect=dialect).segments)


def _post(proxy: Proxy, dialect: Dialect, model: str, *, stream: bool = True) -> bytes:
    response = raw_post(proxy.mitmdump.url + PATHS[dialect], body=_request(dialect, model, stream=stream))
    assert (response.status, response.error) == (200, None), response
    return response.body


# -- the limit reasons, streamed and whole ------------------------------------------------------

#: What each dialect's stream says where the worker hid the limit, before and after finish_fix.
CORRECTED = {
    Dialect.CHAT: (b'"finish_reason":"stop"', b'"finish_reason":"length"', "C11"),
    Dialect.MESSAGES: (b'"stop_reason":"end_turn"', b'"stop_reason":"max_tokens"', "M8"),
}


@pytest.mark.parametrize("dialect", list(CORRECTED))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_reason_that_hides_the_limit_is_said_as_the_limit(proxy, dialect, stream):
    model = f"w-{dialect}-{stream};{LLAMA_CPP}"
    upstream = _worker_body(dialect, model, stream=stream)
    hidden, said, rule = CORRECTED[dialect]
    assert hidden in upstream
    body = _post(proxy, dialect, model, stream=stream)
    # Only the reason changed: the rest is the worker's bytes.
    assert body == upstream.replace(hidden, said)
    row = proxy.ledger_row(model)
    assert row["verdict"] == "repaired" and row["repairs"] == [
        f"limit reason ({rule}): '{hidden.split(b':')[1].strip(b'"').decode()}' at {LIMIT} output tokens of the request's "
        f"{LIMIT} sent as '{said.split(b':')[1].strip(b'"').decode()}'"
    ], row


def test_a_responses_stream_completed_at_the_limit_ends_incomplete_with_its_indexes(proxy):
    model = f"w-responses-raw;{LLAMA_CPP}"
    upstream = _worker_body(Dialect.RESPONSES, model)
    assert b"sequence_number" not in upstream and b"event: response.completed" in upstream
    body = _post(proxy, Dialect.RESPONSES, model)
    events = data_events(body)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert all("output_index" in event for event in events if "item_id" in event or "item" in event)
    terminal = events[-1]
    assert terminal["type"] == "response.incomplete" and b"event: response.incomplete\n" in body
    assert terminal["response"]["status"] == "incomplete"
    assert terminal["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    row = proxy.ledger_row(model)
    assert row["verdict"] == "repaired" and row["dialect"] == "responses"
    # mitmweb's comment is `finish_fix: ` and this detail: it names both rules.
    assert row["detail"] == "repaired: " + "; ".join(row["repairs"])
    assert (
        row["repairs"][0]
        == f"limit reason (R6): 'response.completed' at {LIMIT} output tokens of the request's {LIMIT} sent as 'response.incomplete'"
    )
    assert row["repairs"][1].startswith(f"responses indexes (R7): filled in sequence_number on {len(events)} events")


def test_a_whole_responses_body_completed_at_the_limit_is_incomplete(proxy):
    model = f"w-responses-whole;{LLAMA_CPP}"
    upstream = json.loads(_worker_body(Dialect.RESPONSES, model, stream=False))
    assert upstream["status"] == "completed"
    response = json.loads(_post(proxy, Dialect.RESPONSES, model, stream=False))
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert {**response, "status": "completed", "incomplete_details": None} == upstream
    assert proxy.ledger_row(model)["verdict"] == "repaired"


def test_a_truthful_server_passes_byte_for_byte(proxy):
    for dialect in PATHS:
        model = f"w-truthful-{dialect};tokens=6"
        assert _post(proxy, dialect, model) == _worker_body(dialect, model)
        assert proxy.ledger_row(model)["verdict"] == "clean"


# -- openai-python's responses.stream() helper ---------------------------------------------------


def _stream_helper(base_url: str, model: str) -> list[Any]:
    with openai_client(base_url) as client:
        with client.responses.stream(model=model, input="Say the sentence about the fox.", max_output_tokens=LIMIT) as stream:
            return list(stream)


def test_the_responses_stream_helper_completes_through_finish_fix(proxy, worker):
    model = f"w-helper;{LLAMA_CPP}"
    # Straight at a server that leaves the indexes out, the helper dies (what a new user meets).
    with pytest.raises(TypeError, match="list indices must be integers or slices, not NoneType"):
        _stream_helper(f"{worker}/v1", model)
    events = _stream_helper(f"{proxy.mitmdump.url}/v1", model)
    terminal = events[-1]
    assert terminal.type == "response.incomplete"
    assert terminal.response.status == "incomplete"
    assert terminal.response.incomplete_details is not None
    assert terminal.response.incomplete_details.reason == "max_output_tokens"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == "The quick brown fox"  # the worker's first 4 tokens: the helper read every delta
    # Its final-response call raises for any incomplete response, as against OpenAI itself.
    with pytest.raises(RuntimeError, match="Didn't receive a `response.completed` event"):
        with openai_client(f"{proxy.mitmdump.url}/v1") as client:
            with client.responses.stream(model=model, input="Hi", max_output_tokens=LIMIT) as stream:
                stream.get_final_response()


def test_the_metrics_count_each_correction_under_its_rule(proxy):
    model = f"w-metrics;{LLAMA_CPP}"
    _post(proxy, Dialect.RESPONSES, model)
    proxy.ledger_row(model)
    proxy.mitmdump.wait_for_output("finish_fix: metrics at", timeout=DEADLINE)
    with urllib.request.urlopen(metrics_url_in(proxy.mitmdump.output), timeout=10) as response:
        text = response.read().decode()
    counts = {
        (sample.labels["dialect"], sample.labels["rule"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "finish_fix_corrections"
        for sample in family.samples
        if sample.name == "finish_fix_corrections_total"
    }
    assert counts[("responses", "limit_reason")] >= 1 and counts[("responses", "responses_indexes")] >= 1
    assert counts[("chat", "stop_sequence_reason")] == 0


def test_with_both_options_off_the_server_bytes_pass(worker, mitmproxy_confdir, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    with running_finish_fix(
        confdir=mitmproxy_confdir,
        upstream_url=worker,
        ledger=ledger,
        options={"finish_fix_limit_reasons": "false", "finish_fix_responses_indexes": "false"},
    ) as mitmdump:
        for dialect in PATHS:
            model = f"w-off-{dialect};{LLAMA_CPP}"
            response = raw_post(mitmdump.url + PATHS[dialect], body=_request(dialect, model))
            assert response.body == _worker_body(dialect, model), dialect
