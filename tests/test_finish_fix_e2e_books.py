"""finish_fix end to end, the books and the knobs: the ledger, the flows mitmweb shows (read back
from a `save_stream_file`), option validation at startup, and rule C6's hook across a hot reload."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from mitmproxy import http
from mitmproxy import io as mitmproxy_io

from finishline import Dialect
from tests.chat_streams import chat_stream
from tests.e2e_support import (
    ANSWER,
    API_KEY,
    CUTS,
    PARTIAL,
    chat_url,
    openai_client,
    raw_post,
    stream_completion,
)
from tests.feeding import complete_events
from tests.fixtures_e2e import FinishFixProxy
from tests.mitmdump_process import FINISH_FIX_SCRIPT, MitmdumpError
from tests.mitmdump_process import start as start_mitmdump_process
from tests.otlp_receiver import running_otlp_receiver
from tests.process_watch import DEADLINE
from tests.test_core_malformed import DIALECTS, cut, healthy, with_malformed
from tests.test_finish_fix_e2e_telemetry import SPAN_WAIT_S, scrape, streams_total
from tests.upstream_server import Ending, Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# -- books ------------------------------------------------------------------------------------------


def test_ledger_has_one_line_per_flow_and_no_headers_keys_or_content(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
) -> None:
    proxy = start_finish_fix()
    scripts = {
        "clean": Script(pieces=chat_stream(ANSWER)),
        "repaired": Script(pieces=chat_stream(ANSWER, finish_reason=None)),
        "interrupted": CUTS["fin-mid-chunk"],
    }
    prefixes = {verdict: upstream.route(script) for verdict, script in scripts.items()}

    for prefix in prefixes.values():
        with openai_client(proxy.base_url(prefix)) as client:
            try:
                stream_completion(client, extra_headers={"x-custom-header": "HEADER-MARKER"})
            except openai.APIError:
                pass

    for verdict, prefix in prefixes.items():
        [record] = proxy.wait_ledger_lines(prefix)
        assert record["verdict"] == verdict, record
        assert record.get("method") == "POST", record
        assert record.get("status") == 200, record
        assert record.get("model") == "e2e-model", record
        assert "?" not in record.get("url", "?"), record
    assert len(proxy.ledger_lines()) == 3
    for record in proxy.ledger_lines():
        missing = LEDGER_FIELDS - record.keys()
        assert not missing, f"ledger line lacks {sorted(missing)}: {record}"
        assert any("bytes" in key for key in record), f"no byte count: {record}"
        assert isinstance(record["events"], int) and record["events"] > 0, record
        assert isinstance(record["duration"], (int, float)), record
        assert isinstance(record["time_to_first_event"], (int, float)), record
    [repaired] = proxy.ledger_lines(prefixes["repaired"])
    assert repaired["injected"], f"a repaired line says what was injected: {repaired}"
    ledger_text = proxy.ledger.read_text()
    for secret in (
        API_KEY,
        "Bearer",
        "PROMPT-MARKER",
        "ANSWER",
        "HEADER-MARKER",
        "x-custom-header",
        "authorization",
        "user-agent",
    ):
        assert secret.lower() not in ledger_text.lower(), f"{secret!r} leaked into the ledger"
    proxy.mitmdump.stop()
    summary = re.search(r"finish_fix:.*\b1 repaired\b.*", proxy.mitmdump.output)
    assert summary and "1 clean" in summary.group(0) and "1 interrupted" in summary.group(0), (
        "no summary of counts by verdict at shutdown"
    )


# Issue 2: "time, method, URL without query, status, model, verdict, events, bytes, time to first
# event, duration, what was injected".
LEDGER_FIELDS = {"time", "method", "url", "status", "model", "verdict", "events", "time_to_first_event", "duration", "injected"}


def test_ledger_url_has_no_query(finish_fix: FinishFixProxy, upstream: UpstreamServer) -> None:
    prefix = upstream.route(Script(pieces=chat_stream(ANSWER)))

    raw_post(chat_url(finish_fix.mitmdump.url, prefix) + "?api-key=QUERY-SECRET")

    [record] = finish_fix.wait_ledger_lines(prefix)
    assert "QUERY-SECRET" not in json.dumps(record)
    assert record["url"].endswith(f"{prefix}/v1/chat/completions"), record


# -- options ----------------------------------------------------------------------------------------


BAD_OPTIONS = {
    "finish_fix_on_cut": "bogus",
    "finish_fix_paths": "([unclosed",
    # the size of the copy kept for mitmweb ("Keep a bounded copy (option, default a few MB)")
    "finish_fix_body_copy": "notanumber",
    # a bool option has the int trap too: a value `--set` cannot parse drops the whole script
    "finish_fix_empty_to_null": "notabool",
    "finish_fix_ledger": "/nonexistent-folder/ledger.jsonl",
}


@pytest.mark.parametrize("name,value", BAD_OPTIONS.items(), ids=BAD_OPTIONS.keys())
def test_bad_option_value_is_refused_loudly(mitmproxy_confdir, upstream: UpstreamServer, name: str, value: str) -> None:
    _assert_refused(mitmproxy_confdir, upstream, name, value)


def _assert_refused(confdir, upstream: UpstreamServer, name: str, value: str) -> None:
    """mitmdump must exit non-zero naming `name`; listening quietly for a few seconds is a failure."""
    mitmdump = start_mitmdump_process(
        confdir=confdir,
        mode=f"reverse:{upstream.origin}",
        scripts=[FINISH_FIX_SCRIPT],
        options={name: value},
        wait_ready=False,
    )
    try:
        try:
            mitmdump.wait_for_output(r"listening at|Error logged during startup", timeout=DEADLINE)
            # A backstop with a loaded machine's room: a refused option ends mitmdump at once.
            mitmdump.wait_exit(timeout=DEADLINE)
        except MitmdumpError:
            pass  # judged below, from the process itself
        if mitmdump.process.poll() is None:
            pytest.fail(
                f"mitmdump kept running with --set {name}={value} ({DEADLINE} s after its startup output):\n{mitmdump.output}",
                pytrace=False,
            )
        code = mitmdump.process.returncode
        assert code != 0, f"mitmdump exited 0 with --set {name}={value}:\n{mitmdump.output}"
        assert name in mitmdump.output, f"the error does not name {name}:\n{mitmdump.output}"
        assert "Traceback" not in mitmdump.output, f"a traceback, not one line:\n{mitmdump.output}"
    finally:
        mitmdump.stop()


# -- what mitmweb shows: the flow as mitmproxy saved it --------------------------------------------------


def test_saved_flows_carry_verdict_mark_comment_and_the_bytes_sent(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer, tmp_path
) -> None:
    # mitmproxy's Save addon runs after the script loader, so a saved flow is what mitmweb would hold
    # once finish_fix's hooks ran; on the error path too ("content missing" otherwise).
    flows_file = tmp_path / "flows.mitm"
    proxy = start_finish_fix(save_stream_file=str(flows_file))
    prefixes = {
        "clean": upstream.route(Script(pieces=chat_stream(ANSWER))),
        "repaired": upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None))),
        "interrupted": upstream.route(CUTS["fin-mid-chunk"]),
    }
    sent = {verdict: raw_post(chat_url(proxy.mitmdump.url, prefix)).body for verdict, prefix in prefixes.items()}
    for prefix in prefixes.values():
        proxy.wait_ledger_lines(prefix)
    proxy.mitmdump.stop()

    with flows_file.open("rb") as saved:
        flows = {
            flow.request.path.split("/")[1]: flow
            for flow in mitmproxy_io.FlowReader(saved).stream()
            if isinstance(flow, http.HTTPFlow)
        }
    assert sorted(flows) == sorted(prefix.strip("/") for prefix in prefixes.values())
    for verdict, prefix in prefixes.items():
        flow = flows[prefix.strip("/")]
        assert flow.response is not None
        assert flow.metadata["finish_fix"]["verdict"] == verdict, flow.metadata
        assert flow.response.raw_content == sent[verdict], f"{verdict}: copy differs from what was sent"
        if verdict == "clean":
            assert not flow.marked and not flow.comment
        else:
            assert flow.marked, f"{verdict} flow is not marked"
            assert flow.comment.startswith("finish_fix:"), flow.comment


# -- rule C6's private hook across a hot reload ------------------------------------------------------


def test_cut_repair_still_works_once_after_a_hot_reload(start_mitmdump, upstream: UpstreamServer, tmp_path) -> None:
    # A copy of the script (it imports the installed package) so the test can touch it (mitmproxy
    # reloads it when its mtime changes) without touching the checkout. A hook wrapped twice would
    # send two error events.
    script = tmp_path / FINISH_FIX_SCRIPT.name
    shutil.copyfile(FINISH_FIX_SCRIPT, script)
    mitmdump = start_mitmdump(mode=f"reverse:{upstream.origin}", scripts=[script])
    prefix = upstream.route(CUTS["fin-mid-chunk"])
    before = raw_post(chat_url(mitmdump.url, prefix))

    for reload in (1, 2):
        future = time.time() + 10 * reload
        os.utime(script, (future, future))
        mitmdump.wait_for_output(rf"(Loading script.*\n(.|\n)*){{{reload + 1}}}", timeout=DEADLINE)
        after = raw_post(chat_url(mitmdump.url, prefix))
        added = complete_events(after.body[len(b"".join(PARTIAL)) :])
        assert len(added) == 1, f"after reload {reload}: {added}"
        assert json.loads(added[0])["error"]["code"] == "stream_interrupted"
        assert after.body.startswith(b"".join(PARTIAL)) and before.body.startswith(b"".join(PARTIAL))


def test_saved_copy_is_bounded_and_keeps_the_start_and_the_end(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer, tmp_path
) -> None:
    flows_file = tmp_path / "flows.mitm"
    proxy = start_finish_fix(save_stream_file=str(flows_file), finish_fix_body_copy="4KB")
    pieces = chat_stream([f"token {index} " for index in range(500)], finish_reason=None)
    prefix = upstream.route(Script(pieces=pieces))
    sent = raw_post(chat_url(proxy.mitmdump.url, prefix)).body
    proxy.wait_ledger_lines(prefix)
    proxy.mitmdump.stop()

    with flows_file.open("rb") as saved:
        [flow] = list(mitmproxy_io.FlowReader(saved).stream())
    assert isinstance(flow, http.HTTPFlow) and flow.response is not None
    copy = flow.response.raw_content
    assert copy is not None and len(sent) > 40_000
    assert len(copy) <= 4096 + 512, f"copy of {len(copy)} bytes for a 4KB bound"
    assert copy[:1000] == sent[:1000] and copy[-1000:] == sent[-1000:]


def test_with_store_streamed_bodies_mitmproxy_stores_the_repaired_stream(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer, tmp_path
) -> None:
    # The cut hook sends finish_fix's pieces itself only while mitmproxy is not to store them: with
    # the option on, mitmproxy's own method sends and stores them, so with finish_fix's copy off the
    # saved body is mitmproxy's, and it is what the client was sent (repaired, and with the error
    # event after a cut).
    flows_file = tmp_path / "flows.mitm"
    proxy = start_finish_fix(save_stream_file=str(flows_file), store_streamed_bodies="true", finish_fix_body_copy="0")
    prefixes = {
        "repaired": upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None))),
        "interrupted": upstream.route(CUTS["fin-mid-chunk"]),
    }
    sent = {verdict: raw_post(chat_url(proxy.mitmdump.url, prefix)).body for verdict, prefix in prefixes.items()}
    for prefix in prefixes.values():
        proxy.wait_ledger_lines(prefix)
    proxy.mitmdump.stop()

    repaired = complete_events(sent["repaired"])
    assert repaired[-1] == "[DONE]" and json.loads(repaired[-2])["choices"][0]["finish_reason"] == "stop"
    assert json.loads(complete_events(sent["interrupted"])[-1])["error"]["code"] == "stream_interrupted"
    with flows_file.open("rb") as saved:
        flows = {
            flow.request.path.split("/")[1]: flow
            for flow in mitmproxy_io.FlowReader(saved).stream()
            if isinstance(flow, http.HTTPFlow)
        }
    stored = flows[prefixes["repaired"].strip("/")]
    assert stored.response is not None
    assert stored.metadata["finish_fix"]["verdict"] == "repaired"
    assert stored.response.raw_content == sent["repaired"]


def test_a_client_that_goes_away_is_booked_as_such_not_as_an_upstream_cut(
    finish_fix: FinishFixProxy, upstream: UpstreamServer
) -> None:
    texts = [f"token {index} " for index in range(30)]
    prefix = upstream.route(Script(pieces=chat_stream(texts, finish_reason=None), pause_between_s=0.1))

    with httpx.Client(trust_env=False, timeout=10) as client:
        with client.stream("POST", chat_url(finish_fix.mitmdump.url, prefix), json={}) as response:
            assert next(response.iter_raw()).startswith(b"data:")
        # leaving the block closes the connection after the first piece, mid-stream

    [record] = finish_fix.wait_ledger_lines(prefix)
    assert record["verdict"] == "interrupted", record
    assert "client" in record["detail"].lower(), record
    assert record["injected"] == [], record


# -- rule C8's books: a malformed stream, on the wire -------------------------------------------------

#: Each dialect's path (the default path options match them).
_PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}


def test_a_malformed_stream_reaches_the_client_byte_for_byte_and_is_booked_malformed_in_every_dialect(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer, tmp_path
) -> None:
    # In each dialect: the worker's malformed event in a stream that ends well, and in one cut by a
    # FIN mid-chunk. The ledger line (and the flow mitmweb would hold), the metrics and the span say
    # malformed, the ledger names the event, and all keep the cut; the client got every upstream byte.
    flows_file = tmp_path / "flows.mitm"
    with running_otlp_receiver() as receiver:
        proxy = start_finish_fix(
            save_stream_file=str(flows_file), finish_fix_metrics="127.0.0.1:0", finish_fix_otlp=receiver.endpoint
        )
        cases = _a_malformed_stream_in_every_dialect(proxy, upstream)
        # The spans are awaited while mitmdump runs (its exporter sends every second), not left to its
        # shutdown, which gives the last spans only SHUTDOWN_TIMEOUT_S: on a loaded machine some missed it.
        spans = receiver.wait_for(2 * len(DIALECTS), SPAN_WAIT_S)
        proxy.mitmdump.stop()
    _the_saved_flows_say_malformed(flows_file, len(cases))
    assert receiver.errors == []
    assert len(spans) == 2 * len(DIALECTS)
    for span in spans:
        assert span.attributes["finish_fix.verdict"] == "malformed", span.attributes
        assert span.attributes["error.type"] == "malformed", span.attributes
        assert span.status_code == "STATUS_CODE_ERROR"
    causes = Counter((span.attributes["finish_fix.dialect"], span.attributes.get("finish_fix.cause")) for span in spans)
    assert causes == {key: 1 for dialect in DIALECTS for key in ((str(dialect), None), (str(dialect), "transport_error"))}


def _a_malformed_stream_in_every_dialect(proxy: FinishFixProxy, upstream: UpstreamServer) -> dict[tuple[Dialect, str], object]:
    """The streams, the ledger and the metrics; returns the cases sent."""
    cases: dict[tuple[Dialect, str], tuple[str, bytes, int]] = {}
    for dialect in DIALECTS:
        for name, events, ending in (("ended", healthy(dialect), Ending.CLEAN), ("cut", cut(dialect), Ending.FIN_MID_CHUNK)):
            body, number = with_malformed(events, dialect)
            prefix = upstream.route(Script(pieces=[body], ending=ending, cut_tail=b"data: {"))
            cases[dialect, name] = (prefix, body, number)
    sent = {key: raw_post(f"{proxy.mitmdump.url}{prefix}{_PATHS[key[0]]}") for key, (prefix, _, _) in cases.items()}
    for (dialect, name), (prefix, body, number) in cases.items():
        [record] = proxy.wait_ledger_lines(prefix, timeout=60)
        assert record["dialect"] == str(dialect), record
        assert record["verdict"] == "malformed", record
        assert record["detail"].startswith(f"malformed: event {number}'s data is not JSON; passed on as it came"), record
        received = sent[dialect, name]
        assert received.error is None, received
        if name == "ended":
            assert received.body == body, f"{dialect}: the client did not get the upstream's bytes"
            assert record["detail"] == f"malformed: event {number}'s data is not JSON; passed on as it came", record
            assert record["injected"] == [], record
        else:  # the cut is kept: its detail follows, and the error event went out after the upstream's bytes
            assert received.body.startswith(body), f"{dialect}: the client did not get the upstream's bytes"
            assert "; interrupted after the first token (transport error: " in record["detail"], record
            assert record["injected"][0]["kind"] == "error_event", record
    counted = {key: count for key, count in streams_total(scrape(proxy)).items() if count}
    assert counted == {
        key: 1
        for dialect in DIALECTS
        for key in ((str(dialect), "malformed", "none"), (str(dialect), "malformed", "transport_error"))
    }
    return dict(cases)


def _the_saved_flows_say_malformed(flows_file: Path, count: int) -> None:
    """The flows mitmdump saved (read once it stopped): each marked and commented malformed."""
    with flows_file.open("rb") as saved:
        flows = [flow for flow in mitmproxy_io.FlowReader(saved).stream() if isinstance(flow, http.HTTPFlow)]
    assert len(flows) == count
    for flow in flows:
        assert flow.metadata["finish_fix"]["verdict"] == "malformed", flow.metadata
        assert flow.marked == ":x:", flow.marked
        assert flow.comment.startswith("finish_fix: malformed: event "), flow.comment
