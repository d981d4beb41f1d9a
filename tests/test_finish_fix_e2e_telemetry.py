"""finish_fix's metrics and spans end to end (docs/telemetry.md): a real mitmdump in front of the
scripted upstream, its real `/metrics` scraped over HTTP, its spans sent by the real OTLP/HTTP
exporter to a real receiver that decodes them with opentelemetry-proto (tests/otlp_receiver.py);
a collector that refuses every connection changes no byte of any stream; with both options off
neither library is imported; and after a real lab run finish_fix's counters are its ledger's."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from faults.child_processes import run_child
from labs.gateways.finish_fix_scrape import metrics_url_in
from labs.plan import LabConfig
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.chat_streams import chat_stream
from tests.e2e_support import ANSWER, CUTS, chat_url, raw_post
from tests.fixtures_e2e import FinishFixProxy
from tests.fixtures_lab import run_trio
from tests.otlp_receiver import ReceivedSpan, refusing_otlp_endpoint, running_otlp_receiver
from tests.process_watch import DEADLINE
from tests.upstream_server import Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SPAN_WAIT_S = 30
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
#: The three streams of the contract: a healthy one, one whose upstream omits finish_reason, a cut.
STREAMS = {
    "clean": Script(pieces=chat_stream(ANSWER)),
    "repaired": Script(pieces=chat_stream(ANSWER, finish_reason=None)),
    "interrupted": CUTS["fin-mid-chunk"],
}


def streams_total(metrics_text: str) -> dict[tuple[str, str, str], float]:
    """{(dialect, verdict, cause): count} of a scrape's `finish_fix_streams_total`."""
    return {
        (sample.labels["dialect"], sample.labels["verdict"], sample.labels["cause"]): sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "finish_fix_streams_total"
    }


def scrape(proxy: FinishFixProxy) -> str:
    proxy.mitmdump.wait_for_output("finish_fix: metrics at", timeout=DEADLINE)
    url = metrics_url_in(proxy.mitmdump.output)
    assert url is not None, proxy.mitmdump.output
    response = httpx.get(url, timeout=10, trust_env=False)
    assert response.status_code == 200
    return response.text


def test_three_streams_are_counted_and_each_is_one_span(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer
):
    with running_otlp_receiver() as receiver:
        proxy = start_finish_fix(finish_fix_metrics="127.0.0.1:0", finish_fix_otlp=receiver.endpoint)
        prefixes = {verdict: upstream.route(script) for verdict, script in STREAMS.items()}
        traceparent = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        for verdict, prefix in prefixes.items():
            raw_post(chat_url(proxy.mitmdump.url, prefix), headers=traceparent if verdict == "interrupted" else None)
            proxy.wait_ledger_lines(prefix)
        spans = receiver.wait_for(3, SPAN_WAIT_S)
        metrics = scrape(proxy)
    assert receiver.errors == []

    counted = {key: count for key, count in streams_total(metrics).items() if count}
    assert counted == {
        ("chat", "clean", "none"): 1,
        ("chat", "repaired", "none"): 1,
        ("chat", "interrupted", "transport_error"): 1,
    }
    assert 'finish_fix_streams_in_flight{dialect="chat"} 0.0' in metrics

    assert len(spans) == 3
    by_verdict: dict[str, ReceivedSpan] = {span.attributes["finish_fix.verdict"]: span for span in spans}
    assert set(by_verdict) == set(STREAMS)
    for span in spans:
        assert span.name == "chat e2e-model"
        assert span.kind == "SPAN_KIND_CLIENT"
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.request.model"] == "e2e-model"
        assert span.attributes["gen_ai.request.stream"] is True
        assert (span.attributes["server.address"], span.attributes["server.port"]) == ("127.0.0.1", upstream.port)
        assert span.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert by_verdict["clean"].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert "error.type" not in by_verdict["clean"].attributes
    assert by_verdict["repaired"].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert [name for name, _ in by_verdict["repaired"].events] == ["finish_fix.injection"]
    assert by_verdict["repaired"].events[0][1]["finish_fix.injection.kind"] == "finish"

    cut = by_verdict["interrupted"]
    assert cut.attributes["error.type"] == "stream_interrupted"
    assert cut.attributes["gen_ai.response.finish_reasons"] == ["error"]
    assert cut.status_code == "STATUS_CODE_ERROR"
    assert [attributes["finish_fix.injection.kind"] for _, attributes in cut.events] == ["error_event"]
    # The request's traceparent: the cut's span continues that trace; the others start their own.
    assert (cut.trace_id, cut.parent_span_id) == (TRACE_ID, PARENT_ID)
    assert by_verdict["clean"].parent_span_id == "" and by_verdict["clean"].trace_id != TRACE_ID


@pytest.fixture
def refusing_endpoint() -> Iterator[str]:
    with refusing_otlp_endpoint() as endpoint:
        yield endpoint


# The cut's error event says how long the stream ran ("after 2 events and 0.0 s"): the one part of
# a stream that is the clock's, not the upstream's, so the comparison below leaves it out.
_ELAPSED = re.compile(rb"and \d+\.\d s")


def test_a_dead_collector_changes_no_byte_of_any_stream(
    start_finish_fix: Callable[..., FinishFixProxy], upstream: UpstreamServer, refusing_endpoint: str
):
    scripts = {**STREAMS, "cut-reset": CUTS["tcp-reset"], "short-content-length": CUTS["short-content-length"]}
    prefixes = {name: upstream.route(script) for name, script in scripts.items()}
    with_otlp = start_finish_fix(finish_fix_otlp=refusing_endpoint)
    without = start_finish_fix()

    for name, prefix in prefixes.items():
        received = [raw_post(chat_url(proxy.mitmdump.url, prefix)) for proxy in (with_otlp, without)]
        assert received[0].status == received[1].status == 200, name
        assert _ELAPSED.sub(b"", received[0].body) == _ELAPSED.sub(b"", received[1].body), name
        assert (received[0].error is None) == (received[1].error is None), name
        for proxy in (with_otlp, without):
            [line] = proxy.wait_ledger_lines(prefix)
        assert line["verdict"] == with_otlp.ledger_lines(prefix)[0]["verdict"]

    with_otlp.mitmdump.wait_for_output("finish_fix: cannot export spans to", timeout=SPAN_WAIT_S)
    assert with_otlp.mitmdump.stop() == 0  # its shutdown gives up on the dead collector, not killed
    assert with_otlp.mitmdump.output.count("cannot export spans") == 1, with_otlp.mitmdump.output
    assert "opentelemetry" not in with_otlp.mitmdump.output


def test_with_both_off_neither_library_is_imported(tmp_path: Path):
    """finish_fix with its defaults, loaded and configured in mitmproxy's own test context in a
    fresh interpreter, imports neither prometheus-client nor OpenTelemetry."""
    probe = (
        "import sys\n"
        "from mitmproxy.test import taddons\n"
        "from finishline.addon.hooks import FinishFix\n"
        "fix = FinishFix()\n"
        "with taddons.context(fix) as tctx:\n"
        "    tctx.configure(fix)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('prometheus_client', 'opentelemetry')}))\n"
    )
    result = run_child([sys.executable, "-c", probe], timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- a lab run ------------------------------------------------------------------------------------

LAB_SCENARIOS = ("healthy", "reason-omitted", "cut-after-tokens-fin", "error-event-429", "http-400-context-length")
LAB_DEADLINE_S = 100


def test_after_a_lab_run_the_counters_are_the_ledgers_counts(tmp_path: Path):
    scenarios = tuple(
        dataclasses.replace(load_scenario(SCENARIO_DIR / f"{name}.toml"), gateways=("finish_fix",), clients=("httpx-sse",))
        for name in LAB_SCENARIOS
    )
    config = LabConfig(scenarios=scenarios, clients=("httpx-sse",), gateways=("finish_fix",), results_dir=tmp_path)

    result = run_trio(run_lab, config, deadline=LAB_DEADLINE_S)
    assert len(result.cells) == len(LAB_SCENARIOS)
    [ledger] = tmp_path.rglob("finish_fix-ledger.jsonl")
    [metrics] = tmp_path.rglob("finish_fix-metrics.prom")
    lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    books = Counter(line["verdict"] for line in lines)
    counted: Counter[str] = Counter()
    for (_, verdict, _), count in streams_total(metrics.read_text()).items():
        counted[verdict] += int(count)
    assert +counted == books
    # Every verdict the scenarios were picked for is there, so the equality above is not of empty books.
    assert set(books) >= {"clean", "repaired", "interrupted", "upstream_error", "http_error"}
