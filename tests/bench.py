"""finish_fix's cost next to plain mitmdump, in one run: `make bench` (`python -m tests.bench`).

Not a test: it asserts nothing about speed. The same scripted stream (a healthy chat completion of N
events, one event per HTTP chunk) goes from a local upstream through:

- nothing (the client reads the upstream directly: the ceiling of this machine's loopback and of the
  Python upstream and client),
- plain `mitmdump` in reverse mode, streaming (`--set stream_large_bodies=1`; without it mitmdump
  buffers the whole body, and that is shown too),
- `mitmdump -s addons/finish_fix.py` in reverse mode (defaults: it streams every SSE response).

For each it reports events per second over the whole stream, the time to first event (median of
several short streams), and mitmdump's resident memory read from /proc while the long stream flows
(at 10%, 50% and 90% of it) and its peak (VmHWM) after a 10k-event and after a 100k-event stream in
the same process: if memory grew with stream length, the second peak would be far above the first.

Then the many-users shape: 200 streams of 200 events at once through one mitmdump (plain streaming
and finish_fix), as streams/s and events/s. Last, the repair core alone (no mitmdump, no sockets),
fed the long stream one event per call, with and without its fast path for routine chunks. The
closing lines put the three figures of issue 9 side by side with their targets.

The client is a socket with h11 that counts `data: ` marks in the body, so that a full client's
overhead does not hide the proxy's; the concurrent streams are read the same way, all from one
thread with `selectors`.

Where the machine has two CPUs or more, the client and the upstream (this process) are pinned to one
and every mitmdump to another, so that the load generator never takes CPU time from the proxy under
test (`--no-pin` leaves placement to the scheduler). On a shared machine the speed of a CPU still
drifts from one second to the next, so the long stream is also raced: plain streaming mitmdump and
finish_fix stream it at the same time on the same CPU, and the ratio is the events each had sent
when the first finished. Both then run under the same conditions at every moment, so that ratio
is what finish_fix costs, with little of the drift that the rounds taken one after the other carry.
The concurrent shape is raced too: its streams through both at once, the requests alternating
between the two so that neither has a head start, counted when the first had ended all of its own.

The other two dialects get the long stream too: a healthy N-delta Anthropic Messages stream and a
healthy N-delta OpenAI Responses stream (`dialect_stream`, built by the same event builders as the
worker's and the tests' streams, `tests.dialect_streams`), served on `.../v1/messages` and
`.../v1/responses` so that finish_fix reads each in its dialect, each through plain streaming mitmdump
and finish_fix in paired rounds and raced, their concurrent shape (many short streams of the same
builders) raced the same way as Chat's, and the core alone on each one's routine text deltas.
Gemini likewise: a healthy N-chunk Google Gemini stream (the worker's builders: one text part per
chunk, `usageMetadata` counting on, a last chunk with `STOP`) served on
`.../v1beta/models/bench:streamGenerateContent?alt=sse`, and the core alone on its routine text
chunks. `--dialect` picks the dialects (default all four; Chat's figures are everything above).

With Chat, finish_fix also runs a third time with its metrics and spans on (`finish_fix_metrics`
on a port of its own, `finish_fix_otlp` to a real OTLP receiver in this process, which decodes
every span): paired with the others, and raced against finish_fix with both off on the long stream
and the concurrent shape, whose 200-event streams make the per-stream work (counters, a span)
show; target 0.95x of finish_fix alone. Its counters and the spans received are checked at the end,
so the ratio is never that of a configuration that did nothing.

Every stream read to its end, through any path, must be the upstream's body byte for byte
(`UpstreamBody.check`): a healthy stream passes every proxy untouched, so a ratio never compares
different work; the bench stops with an error otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import selectors
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import h11
import httpx

from finishline import Dialect, RequestFacts, StreamRepair, gemini_request_facts
from labs.dialects import LAB_DIALECTS
from labs.gateways.finish_fix_scrape import metrics_url_in
from tests import mitmdump_process
from tests.chat_streams import chat_chunk, sse_event
from tests.dialect_streams import gemini_stream, messages_stream, responses_stream
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump
from tests.otlp_receiver import OtlpReceiver, running_otlp_receiver
from tests.upstream_server import Script, UpstreamServer

_DATA_MARK = b"data: "
_RECV_SIZE = 1 << 20
_DEADLINE_S = 300.0
# The upstream writes its chunks (one event each) in socket writes of this size, as a fast server
# under load does; one write per event would make the Python upstream the bottleneck.
_WRITE_BATCH = 64 * 1024  # one stream; the whole bench has no other limit than the sum of these


#: Per dialect, the API path the bench's streams are served on (after the route's prefix), which
#: finish_fix's default path option for that dialect matches (`tests/test_bench_streams.py`), and the
#: body of the streaming request the client sends there.
API: dict[Dialect, tuple[str, dict]] = {
    Dialect.CHAT: ("/v1/chat/completions", {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "go"}]}),
    # max_tokens above any stream's output tokens: nothing here is cut by it.
    Dialect.MESSAGES: (
        "/v1/messages",
        {"model": "bench", "max_tokens": 1 << 30, "stream": True, "messages": [{"role": "user", "content": "go"}]},
    ),
    Dialect.RESPONSES: ("/v1/responses", {"model": "bench", "stream": True, "input": "go"}),
    # Gemini names the model in the path and streams SSE when asked (`alt=sse`).
    Dialect.GEMINI: (
        "/v1beta/models/bench:streamGenerateContent?alt=sse",
        {"contents": [{"role": "user", "parts": [{"text": "go"}]}], "generationConfig": {"maxOutputTokens": 1 << 30}},
    ),
}
#: The lab's dialects the bench has a stream for (all four).
BENCH_DIALECTS: tuple[Dialect, ...] = tuple(dialect for dialect in LAB_DIALECTS if dialect in API)

# The long stream's builder per dialect other than Chat (whose `healthy_stream` is a template, faster
# to build): one message of text deltas, well formed, one SSE event per piece.
_DIALECT_BUILDERS: dict[Dialect, Callable[[list[str]], list[bytes]]] = {
    Dialect.MESSAGES: messages_stream,
    Dialect.RESPONSES: responses_stream,
    Dialect.GEMINI: gemini_stream,
}


def healthy_stream(events: int) -> Callable[[], Iterator[bytes]]:
    """`events` content chunks, then a finish chunk and [DONE]: one SSE event per piece."""

    def pieces() -> Iterator[bytes]:
        # Build one template and vary only the token, so the upstream itself is cheap.
        template = json.dumps(chat_chunk(content="@@@@")).replace('"@@@@"', '"%s"')
        for index in range(events):
            yield b"data: " + (template % f"tok{index} ").encode() + b"\n\n"
        yield sse_event(chat_chunk(finish_reason="stop"))
        yield sse_event("[DONE]")

    return pieces


def request_facts(dialect: Dialect) -> RequestFacts:
    """What finish_fix reads of the bench's request in `dialect` (for Gemini, from its path too)."""
    path, body = API[dialect]
    facts = RequestFacts.from_body(json.dumps(body).encode())
    if dialect is Dialect.GEMINI:
        path, _, query = path.partition("?")
        facts = gemini_request_facts(facts, path, query)
    return facts


def dialect_stream(dialect: Dialect, events: int) -> list[bytes]:
    """A healthy stream of `dialect` whose text comes in `events` routine text deltas (the same
    tokens as `healthy_stream`'s), one SSE event per piece, each with one `data:` line.

    Messages: `message_start`, `ping`, one text block of `events` `text_delta`s, `message_delta`
    (`end_turn`), `message_stop`. Responses: `response.created` ... `events`
    `response.output_text.delta`s ... `response.completed` (whose response carries the whole text).
    Gemini: `events` chunks of one text part each, then one with an empty part and `STOP`.
    """
    if dialect is Dialect.CHAT:
        return list(healthy_stream(events)())
    return _DIALECT_BUILDERS[dialect]([f"tok{index} " for index in range(events)])


@dataclass(frozen=True)
class UpstreamBody:
    """What the upstream sends on a route: its events (`data:` lines), size and SHA-256. A stream
    read to its end through any path must match it: a healthy stream passes every proxy untouched,
    and a ratio of two paths that sent different bytes would compare different work."""

    events: int
    size: int
    sha256: bytes

    @classmethod
    def of(cls, pieces: list[bytes]) -> UpstreamBody:
        digest = hashlib.sha256()
        for piece in pieces:
            digest.update(piece)
        return cls(sum(piece.count(_DATA_MARK) for piece in pieces), sum(map(len, pieces)), digest.digest())

    def check(self, marks: _MarkCounter, source: str) -> None:
        """Raises RuntimeError unless `marks` read exactly this body (from `source`, for the message)."""
        if marks.events != self.events or marks.received != self.size or marks.sha256() != self.sha256:
            raise RuntimeError(
                f"the body from {source} is not the upstream's: {marks.events} events, {marks.received} bytes "
                f"(upstream: {self.events} events, {self.size} bytes{', same size, other bytes' if marks.received == self.size else ''})"
            )


@dataclass(frozen=True)
class Route:
    """A stream the upstream serves: the request path (the route's prefix + the dialect's API path),
    the dialect whose request is sent there, and the body that comes back."""

    path: str
    dialect: Dialect
    body: UpstreamBody


def _request_bytes(port: int, route: Route) -> tuple[h11.Connection, bytes]:
    """A new h11 client and the bytes of a streaming request of the route's dialect (Connection: close)."""
    body = json.dumps(API[route.dialect][1]).encode()
    client = h11.Connection(h11.CLIENT)
    request = (
        client.send(
            h11.Request(
                method="POST",
                target=route.path,
                headers=[
                    ("Host", f"127.0.0.1:{port}"),
                    ("Content-Type", "application/json"),
                    ("Accept", "text/event-stream"),
                    ("Content-Length", str(len(body))),
                    ("Connection", "close"),
                ],
            )
        )
        + client.send(h11.Data(data=body))
        + client.send(h11.EndOfMessage())
    )
    return client, request


class _MarkCounter:
    """Counts `data: ` marks in a body read in pieces (a mark may be split across two), and hashes
    the body (`UpstreamBody.check` compares it with the upstream's)."""

    def __init__(self) -> None:
        self.events = 0
        self.received = 0
        self._carry = b""
        self._digest = hashlib.sha256()

    def sha256(self) -> bytes:
        return self._digest.digest()

    def add(self, data: bytes) -> int:
        """Counts the marks `data` completes; returns how many."""
        self.received += len(data)
        self._digest.update(data)
        window = self._carry + data
        found = window.count(_DATA_MARK)
        self.events += found
        self._carry = window[-(len(_DATA_MARK) - 1) :]
        return found


@dataclass
class StreamRun:
    events: int
    seconds: float
    time_to_first_event: float
    body_bytes: int
    rss_samples_kib: dict[int, int] = field(default_factory=dict)


def read_stream(
    port: int,
    route: Route,
    *,
    sample_at: dict[int, int] | None = None,
    sample_rss: Callable[[], int] | None = None,
) -> StreamRun:
    """POST to 127.0.0.1:`port` on `route` (Connection: close), read to EOF, count events; raises
    RuntimeError unless the body is the upstream's (`UpstreamBody.check`).

    Args:
        sample_at: {percent: event count}; when the count passes one, `sample_rss()` is recorded.
    """
    path = route.path
    client, request = _request_bytes(port, route)
    pending = dict(sorted((sample_at or {}).items(), key=lambda item: item[1]))
    samples: dict[int, int] = {}
    marks = _MarkCounter()
    first_event_at: float | None = None
    with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE_S) as connection:
        started = time.perf_counter()
        connection.sendall(request)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(connection.recv(_RECV_SIZE))
                if time.perf_counter() - started > _DEADLINE_S:
                    raise TimeoutError(f"stream from port {port} took over {_DEADLINE_S} s")
                continue
            if isinstance(event, h11.Response) and event.status_code != 200:
                raise RuntimeError(f"HTTP {event.status_code} from port {port}{path}")
            if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
            if not isinstance(event, h11.Data):
                continue
            if marks.add(bytes(event.data)):
                if first_event_at is None:
                    first_event_at = time.perf_counter()
                while pending and marks.events >= next(iter(pending.values())) and sample_rss:
                    percent = next(iter(pending))
                    del pending[percent]
                    samples[percent] = sample_rss()
        finished = time.perf_counter()
    if first_event_at is None:
        raise RuntimeError(f"no event came from port {port}{path} ({marks.received} bytes)")
    route.body.check(marks, f"port {port}{path}")
    return StreamRun(marks.events, finished - started, first_event_at - started, marks.received, samples)


@dataclass
class ConcurrentRun:
    streams: int
    events: int
    seconds: float


def _read_at_once(ports: list[int], route: Route) -> tuple[list[_MarkCounter], float]:
    """Opens a connection to each of `ports` (a port may come several times), sends every request at
    once and reads the responses from this one thread until every stream from one of the ports has
    ended (with one port: all of them). Returns each stream's counter and the seconds from the first
    request sent (the connections are opened before, alike for every path). Every stream that
    ended was checked against the upstream's body (`UpstreamBody.check`)."""
    path = route.path
    connections = [socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE_S) for port in ports]
    selector = selectors.DefaultSelector()
    counters = [_MarkCounter() for _ in ports]
    open_streams = Counter(ports)
    try:
        started = time.perf_counter()
        for port, connection, marks in zip(ports, connections, counters):
            client, request = _request_bytes(port, route)
            connection.sendall(request)
            connection.setblocking(False)
            selector.register(connection, selectors.EVENT_READ, (connection, client, marks, port))
        while True:
            if time.perf_counter() - started > _DEADLINE_S:
                raise TimeoutError(
                    f"{open_streams.total()} of {len(ports)} streams from ports {sorted(open_streams)} took over {_DEADLINE_S} s"
                )
            for key, _ in selector.select(timeout=1.0):
                connection, client, marks, port = key.data  # (`key.fileobj` is typed as any file-like)
                try:
                    client.receive_data(connection.recv(_RECV_SIZE))
                except BlockingIOError:
                    continue
                while (event := client.next_event()) is not h11.NEED_DATA:
                    if isinstance(event, h11.Response) and event.status_code != 200:
                        raise RuntimeError(f"HTTP {event.status_code} from port {port}{path}")
                    if isinstance(event, h11.Data):
                        marks.add(bytes(event.data))
                    elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                        selector.unregister(connection)
                        route.body.check(marks, f"port {port}{path}")
                        open_streams[port] -= 1
                        if not open_streams[port]:
                            return counters, time.perf_counter() - started
                        break
    finally:
        selector.close()
        for connection in connections:
            connection.close()


def read_concurrent_streams(port: int, route: Route, *, streams: int) -> ConcurrentRun:
    """`streams` streams from 127.0.0.1:`port` at once, each read to its end from this one thread
    (and checked against the upstream's body); the time runs from the first request sent to the end
    of the last stream."""
    counters, seconds = _read_at_once([port] * streams, route)
    return ConcurrentRun(streams, sum(marks.events for marks in counters), seconds)


def race(ports: list[int], route: Route, *, streams_each: int = 1) -> list[int]:
    """`streams_each` streams from each port, all at once; the events each port had sent when the
    streams of the first to finish them all had ended (so that all are counted over the same time).
    The requests go out alternating between the ports, so that none has a head start."""
    order = [port for _ in range(streams_each) for port in ports]
    counters, _ = _read_at_once(order, route)
    return [sum(marks.events for port_of, marks in zip(order, counters) if port_of == port) for port in ports]


def pin_processes(load_pid: int, proxy_pids: list[int]) -> str | None:
    """Pins every thread of `load_pid` to one CPU and every thread of each proxy to another (threads
    started later inherit it); returns what it did, or None where it cannot (one CPU, no affinity)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    load_cpu, proxy_cpu = cpus[0], cpus[1]
    for pid, cpu in [(load_pid, load_cpu)] + [(pid, proxy_cpu) for pid in proxy_pids]:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), {cpu})
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
    return f"client and upstream pinned to CPU {load_cpu}, every mitmdump to CPU {proxy_cpu}"


def core_events_per_second(pieces: list[bytes], *, fast_path: bool, dialect: Dialect = Dialect.CHAT, runs: int = 3) -> float:
    """The repair core alone, fed `pieces` (a healthy stream of `dialect`) one per call with a clock
    value, as finish_fix feeds it: the median events (pieces) per second of `runs` streams. Raises
    RuntimeError unless the core passed the stream on byte for byte with the verdict `clean`."""
    rates = []
    request = request_facts(dialect)
    expected = b"".join(pieces)
    for _ in range(runs):
        repair = StreamRepair(request=request, started_at=0.0, fast_path=fast_path, dialect=dialect)
        out = []
        started = time.perf_counter()
        for piece in pieces:
            out.append(repair.receive_data(piece, now=1.0))
        out.append(repair.receive_end(now=2.0))
        seconds = time.perf_counter() - started
        if repair.report.verdict != "clean" or b"".join(out) != expected:
            raise RuntimeError(
                f"the core read the bench's {dialect} stream as {repair.report.verdict} ({repair.report.detail!r})"
            )
        rates.append(len(pieces) / seconds)
    return statistics.median(rates)


@dataclass
class Row:
    name: str
    events_per_second: float
    time_to_first_event_s: float
    long_stream_first_event_s: float
    rss_samples_kib: dict[int, int] = field(default_factory=dict)
    peak_after_short_kib: int | None = None
    peak_after_long_kib: int | None = None
    # mitmdump's CPU microseconds per event (None without a mitmdump).
    cpu_us_per_event: float | None = None
    # The concurrent shape (None for a path it was not run through).
    streams_per_second: float | None = None
    concurrent_events_per_second: float | None = None
    concurrent_cpu_us_per_event: float | None = None
    # Against the baseline path: the median over rounds of this round's figure over the baseline's
    # figure of the same round (taken seconds apart, so load from elsewhere falls on both alike).
    ratio: float = 1.0
    concurrent_ratio: float | None = None
    round_ratios: list[float] = field(default_factory=list)
    concurrent_round_ratios: list[float] = field(default_factory=list)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process used so far, from /proc/PID/stat. Unlike events/s, the
    CPU a proxy spends per event hardly moves when other work shares the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def peak_rss_kib(mitmdump: Mitmdump) -> int:
    status = Path(f"/proc/{mitmdump.pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1))


_Run = TypeVar("_Run", StreamRun, ConcurrentRun)


@dataclass
class Target:
    """One path through which streams are read: a port, and the mitmdump behind it if any."""

    name: str
    port: int
    mitmdump: Mitmdump | None
    tiny_ttfe: list[float] = field(default_factory=list)
    # The long stream of each dialect run through this path, and mitmdump's CPU per event in each.
    long_runs: dict[Dialect, list[StreamRun]] = field(default_factory=dict)
    long_cpu_us: dict[Dialect, list[float]] = field(default_factory=dict)
    peak_after_short_kib: int | None = None
    peak_after_long_kib: int | None = None
    concurrent: bool = False  # whether the concurrent shape runs through it
    concurrent_runs: list[ConcurrentRun] = field(default_factory=list)
    concurrent_cpu_us: list[float] = field(default_factory=list)

    def measured(self, run: Callable[[], _Run], cpu_us: list[float]) -> _Run:
        """`run()`, noting mitmdump's CPU per event in `cpu_us`."""
        mitmdump = self.mitmdump
        before = cpu_seconds(mitmdump.pid) if mitmdump is not None else None
        result = run()
        if mitmdump is not None and before is not None:
            cpu_us.append((cpu_seconds(mitmdump.pid) - before) / result.events * 1e6)
        return result

    def row(self, baseline: Target) -> Row:
        """The Chat figures of this path (`Dialect.CHAT`'s long stream, the concurrent shape)."""
        runs = self.concurrent_runs
        long_runs = self.long_runs[Dialect.CHAT]
        long = self.paired(baseline, Dialect.CHAT)
        return Row(
            name=self.name,
            events_per_second=long.events_per_second,
            time_to_first_event_s=statistics.median(self.tiny_ttfe),
            long_stream_first_event_s=statistics.median(r.time_to_first_event for r in long_runs),
            rss_samples_kib=long_runs[0].rss_samples_kib,
            peak_after_short_kib=self.peak_after_short_kib,
            peak_after_long_kib=self.peak_after_long_kib,
            cpu_us_per_event=long.cpu_us_per_event,
            streams_per_second=statistics.median(r.streams / r.seconds for r in runs) if runs else None,
            concurrent_events_per_second=statistics.median(r.events / r.seconds for r in runs) if runs else None,
            concurrent_cpu_us_per_event=statistics.median(self.concurrent_cpu_us) if self.concurrent_cpu_us else None,
            ratio=long.ratio,
            concurrent_ratio=statistics.median(_round_ratios(runs, baseline.concurrent_runs)) if runs else None,
            round_ratios=long.round_ratios,
            concurrent_round_ratios=_round_ratios(runs, baseline.concurrent_runs),
        )

    def paired(self, baseline: Target, dialect: Dialect) -> Paired:
        """This path's long stream of `dialect` against `baseline`'s, round by round."""
        runs, cpu_us = self.long_runs[dialect], self.long_cpu_us.get(dialect)
        round_ratios = _round_ratios(runs, baseline.long_runs[dialect])
        return Paired(
            events_per_second=statistics.median(r.events / r.seconds for r in runs),
            ratio=statistics.median(round_ratios),
            round_ratios=round_ratios,
            cpu_us_per_event=statistics.median(cpu_us) if cpu_us else None,
        )


@dataclass(frozen=True)
class Paired:
    """One path's long stream of one dialect next to the baseline path's, in the same rounds."""

    events_per_second: float  # median over the rounds
    ratio: float  # median over the rounds of this round's events/s over the baseline's
    round_ratios: list[float]
    cpu_us_per_event: float | None  # mitmdump's, median (None without a mitmdump)


def _round_ratios(runs: list, baseline_runs: list) -> list[float]:
    """Per round, events/s of `runs[i]` over that of `baseline_runs[i]`."""
    return [(run.events / run.seconds) / (base.events / base.seconds) for run, base in zip(runs, baseline_runs)]


def measure(
    targets: list[Target],
    routes: dict[str, Route],
    *,
    ttfe_runs: int,
    long_runs: int,
    concurrent_streams: int,
    concurrent_runs: int,
) -> None:
    """Chat's measurements, each round-robin over `targets`, so that load from elsewhere on the
    machine falls on all of them alike rather than on whichever ran during it."""
    for _ in range(ttfe_runs):
        for target in targets:
            target.tiny_ttfe.append(read_stream(target.port, routes["tiny"]).time_to_first_event)
    for target in targets:
        if target.mitmdump is not None:
            read_stream(target.port, routes["short"])
            target.peak_after_short_kib = peak_rss_kib(target.mitmdump)
    long_rounds(targets, routes["long"], rounds=long_runs, sample_memory=True)
    for round_number in range(concurrent_runs):
        for target in targets if round_number % 2 == 0 else targets[::-1]:
            if target.concurrent:
                target.concurrent_runs.append(
                    target.measured(
                        partial(read_concurrent_streams, target.port, routes["concurrent"], streams=concurrent_streams),
                        target.concurrent_cpu_us,
                    )
                )


def long_rounds(targets: list[Target], route: Route, *, rounds: int, sample_memory: bool = False) -> None:
    """`rounds` rounds of the long stream on `route` through every target, round-robin (every other
    round in reverse order, so that no path always runs right after another), into each target's
    `long_runs[route.dialect]`. `sample_memory`: the first run through each mitmdump also samples its
    RSS at 10/50/90 % of the stream and reads its peak after it."""
    marks = {p: route.body.events * p // 100 for p in (10, 50, 90)}
    for target in targets:
        target.long_runs[route.dialect] = []
        target.long_cpu_us[route.dialect] = []
    for round_number in range(rounds):
        for target in targets if round_number % 2 == 0 else targets[::-1]:
            sampled = target.mitmdump if sample_memory and round_number == 0 else None  # the mitmdump sampled
            target.long_runs[route.dialect].append(
                target.measured(
                    partial(
                        read_stream,
                        target.port,
                        route,
                        sample_at=marks if sampled is not None else None,
                        sample_rss=sampled.rss_kib if sampled is not None else None,
                    ),
                    target.long_cpu_us[route.dialect],
                )
            )
            if sampled is not None:
                target.peak_after_long_kib = peak_rss_kib(sampled)


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def _cpu(us: float | None) -> str:
    return "-" if us is None else f"{us:.1f}"


def print_table(
    rows: list[Row],
    baseline: Row,
    *,
    long_events: int,
    short_events: int,
    long_bytes: int,
    ttfe_runs: int,
    long_runs: int,
    pinned: str | None,
) -> None:
    import mitmproxy.version

    print()
    print(
        f"finish_fix benchmark: a healthy {long_events:,}-event chat stream "
        f"({long_bytes / 1e6:.1f} MB, one event per HTTP chunk) over 127.0.0.1"
    )
    print(
        f"mitmproxy {mitmproxy.version.VERSION}, Python {platform.python_version()}, "
        f"{platform.machine()}, {platform.system()} {platform.release()}; "
        f"{pinned or 'processes not pinned'}"
    )
    print()
    header = (
        f"{'path':<44} {'events/s':>10} {'x plain':>8} {'TTFE ms':>8} {'+TTFE ms':>9} "
        f"{'1st of long':>11} {'CPU us/ev':>9} {'RSS@10%':>8} {'RSS@50%':>8} {'RSS@90%':>8} {'peak ' + format(short_events // 1000) + 'k':>9} "
        f"{'peak ' + format(long_events // 1000) + 'k':>10}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.ratio
        added = (row.time_to_first_event_s - baseline.time_to_first_event_s) * 1000
        print(
            f"{row.name:<44} {row.events_per_second:>10,.0f} {ratio:>8.2f} "
            f"{row.time_to_first_event_s * 1000:>8.2f} {added:>+9.2f} "
            f"{row.long_stream_first_event_s * 1000:>9.1f}ms "
            f"{_cpu(row.cpu_us_per_event):>9} {_mib(row.rss_samples_kib.get(10)):>8} {_mib(row.rss_samples_kib.get(50)):>8} "
            f"{_mib(row.rss_samples_kib.get(90)):>8} {_mib(row.peak_after_short_kib):>9} "
            f"{_mib(row.peak_after_long_kib):>10}"
        )
    print()
    print(
        f"events/s: median of {long_runs} long streams, taken round-robin over the paths. "
        f"x plain: events/s over that of '{baseline.name}' in the same round, median over rounds (paired, so "
        f"load from elsewhere falls on both alike). TTFE: time to first event, median of "
        f"{ttfe_runs} three-event streams,"
    )
    print("each on a new connection (so it includes mitmdump's upstream connect); +TTFE is against the same baseline.")
    print("1st of long: time to the first event of the long stream (a buffering proxy sends nothing until the upstream is done).")
    print(
        "CPU us/ev: mitmdump's own CPU time (user + system, /proc/PID/stat) per event over the long "
        "streams, median; it barely moves with other load,"
    )
    print("so the difference between two rows is what the addon costs per event even when events/s is noisy.")
    print(
        "direct: the client reads the upstream itself, one HTTP chunk per event; mitmdump "
        "re-chunks per read, so the client parses fewer"
    )
    print(
        f"chunks behind it and 'direct' is a reference, not a ceiling. Upstream, mitmdump and "
        f"client share {os.cpu_count()} CPUs" + (" (pinned as above)." if pinned else ".")
    )
    print(
        "RSS in MiB, mitmdump's resident set from /proc/PID/status while the long stream flows "
        "(VmRSS at 10/50/90% of its events);"
    )
    print(
        f"peak = VmHWM after a {short_events:,}-event stream, then after the {long_events:,}-event stream, in the same process."
    )
    print(
        "finish_fix keeps a bounded copy of each stream for mitmweb (finish_fix_body_copy, "
        "default 4MB): expect RSS to rise by up to that much, then stay flat."
    )


def print_concurrent_table(rows: list[Row], *, streams: int, events: int, runs: int) -> None:
    print()
    print(
        f"{streams} concurrent streams of {events} events each (+ finish chunk and [DONE]) through one "
        f"process, all read at once from one client thread"
    )
    header = f"{'path':<44} {'streams/s':>10} {'x plain':>8} {'events/s':>10} {'x plain':>8} {'CPU us/ev':>9}"
    print(header)
    print("-" * len(header))
    for row in rows:
        if row.streams_per_second is None:
            continue
        print(
            f"{row.name:<44} {row.streams_per_second:>10,.1f} "
            f"{row.concurrent_ratio:>8.2f} "
            f"{row.concurrent_events_per_second:>10,.0f} "
            f"{row.concurrent_ratio:>8.2f} "
            f"{_cpu(row.concurrent_cpu_us_per_event):>9}"
        )
    print(
        f"median of {runs} rounds, taken round-robin over the paths (x plain paired per round as above; "
        "every stream has the same events, so streams/s and events/s have the same ratio);"
    )
    print("the time runs from the first request sent to the end of the last stream.")


#: The targets: a finish_fix stream at 0.9x plain mitmdump's or better in the paired rounds (which
#: carry the machine's drift) and 0.97x in every race, the core alone at 1M routine events
#: per second or more in every dialect, and finish_fix with metrics and spans on at 0.95x finish_fix alone.
_RATIO_TARGET = 0.9
_RACE_TARGET = 0.97
_TELEMETRY_TARGET = 0.95
_CORE_TARGET = 1_000_000
_TELEMETRY_ROW = "  same, metrics and OTLP on (receiver up)"
_DIALECT_NAMES = {Dialect.CHAT: "Chat", Dialect.MESSAGES: "Messages", Dialect.RESPONSES: "Responses", Dialect.GEMINI: "Gemini"}
# The routine events the core's figure is about, per dialect (the fast path's, `_routine_chunks`).
_ROUTINE_EVENTS = {
    Dialect.CHAT: "routine single-choice content chunks",
    Dialect.MESSAGES: "content_block_delta text_delta",
    Dialect.RESPONSES: "response.output_text.delta",
    Dialect.GEMINI: "text chunks (one candidate, one text part, usageMetadata counting on)",
}


def _verdict(ok: bool) -> str:
    return "meets the target" if ok else "BELOW the target"


def _rounds(ratios: list[float]) -> str:
    return "per round " + " ".join(f"{ratio:.2f}" for ratio in ratios)


def print_targets(
    *,
    long_events: int,
    chat: tuple[Row, Row] | None,
    concurrent_streams: int,
    concurrent_events: int,
    dialects: dict[Dialect, tuple[Paired, Paired]],
    core: dict[Dialect, tuple[float, float]],
    race_ratios: dict[str, list[float]],
) -> None:
    """The speed figures, each next to its target (figures from this one run).

    Args:
        chat: Chat's (plain mitmdump, finish_fix) rows; None when Chat was not run.
        dialects: per other dialect run, the (plain mitmdump, finish_fix) figures of its long stream.
        core: per dialect run, the core's events/s (fast path, every event fully parsed).
        race_ratios: per race (`long`, `concurrent`, or a dialect's word), each round's ratio.
    """

    def print_long(letter: str, dialect: Dialect, plain: Row | Paired, finish_fix: Row | Paired) -> None:
        print(
            f"  ({letter}) one {long_events // 1000}k-event {_DIALECT_NAMES[dialect]} stream:  "
            f"{finish_fix.events_per_second:,.0f} vs {plain.events_per_second:,.0f} events/s (medians); "
            f"paired {finish_fix.ratio:.2f}x ({_rounds(finish_fix.round_ratios)}; "
            f"target >= {_RATIO_TARGET:.2f}x: {_verdict(finish_fix.ratio >= _RATIO_TARGET)}); "
            f"mitmdump CPU {finish_fix.cpu_us_per_event:.1f} vs {plain.cpu_us_per_event:.1f} us/event"
        )

    def print_race(shape: str, what: str, lead: str = "      raced, ") -> None:
        if race_ratios.get(shape):
            raced = statistics.median(race_ratios[shape])
            print(
                f"{lead}{what} {raced:.2f}x ({_rounds(race_ratios[shape])}; "
                f"target >= {_RACE_TARGET:.2f}x: {_verdict(raced >= _RACE_TARGET)})"
            )

    def print_core(lead: str, dialect: Dialect) -> None:
        fast, full = core[dialect]
        print(
            f"{lead}{_ROUTINE_EVENTS[dialect]} one per call: {fast:,.0f} events/s "
            f"(target >= {_CORE_TARGET:,}: {_verdict(fast >= _CORE_TARGET)}); "
            f"with every event fully parsed (fast_path=False): {full:,.0f} events/s"
        )

    print()
    print("finish_fix (defaults, body copy on) next to plain streaming mitmdump, this run:")
    if chat is not None:
        plain, finish_fix = chat
        print_long("a", Dialect.CHAT, plain, finish_fix)
        print_race("long", "both streaming it at once on one CPU:")
        # Every stream has the same events: the streams/s and events/s ratios are one ratio.
        events_ratio = finish_fix.concurrent_ratio
        assert events_ratio is not None  # finish_fix streams, so the concurrent shape ran through it
        print(
            f"  (b) {concurrent_streams} x {concurrent_events} concurrent: {finish_fix.streams_per_second:,.1f} vs "
            f"{plain.streams_per_second:,.1f} streams/s, "
            f"{finish_fix.concurrent_events_per_second:,.0f} vs {plain.concurrent_events_per_second:,.0f} "
            f"events/s (medians); paired {events_ratio:.2f}x ({_rounds(finish_fix.concurrent_round_ratios)}; "
            f"target >= {_RATIO_TARGET:.2f}x: {_verdict(events_ratio >= _RATIO_TARGET)}); "
            f"mitmdump CPU {finish_fix.concurrent_cpu_us_per_event:.1f} vs {plain.concurrent_cpu_us_per_event:.1f} us/event"
        )
        print_race("concurrent", f"{concurrent_streams} streams through each at once on one CPU: events")
        print_core("  (c) the repair core alone, ", Dialect.CHAT)
    for letter, dialect in (("d", Dialect.MESSAGES), ("e", Dialect.RESPONSES)):
        if dialect in dialects:
            print_long(letter, dialect, *dialects[dialect])
            print_race(str(dialect), "both streaming it at once on one CPU:")
            print_race(
                f"{dialect} concurrent",
                f"{concurrent_streams} x {concurrent_events} concurrent, {concurrent_streams} streams through each at once on one CPU: events",
                lead="      raced, ",
            )
    others = [dialect for dialect in (Dialect.MESSAGES, Dialect.RESPONSES) if dialect in core]
    for position, dialect in enumerate(others):
        lead = "  (f) the repair core alone, " if position == 0 else "      "
        print_core(f"{lead}{_DIALECT_NAMES[dialect]} ", dialect)
    if Dialect.GEMINI in dialects:  # its long stream, its concurrent shape and its core together
        print_long("h", Dialect.GEMINI, *dialects[Dialect.GEMINI])
        print_race(str(Dialect.GEMINI), "both streaming it at once on one CPU:")
        print_race(
            f"{Dialect.GEMINI} concurrent",
            f"{concurrent_streams} x {concurrent_events} concurrent, {concurrent_streams} streams through each at once on one CPU: events",
        )
        print_core("      the repair core alone, Gemini ", Dialect.GEMINI)


def print_telemetry(
    *, long_events: int, concurrent_streams: int, telemetry: Row, alone: Row, race_ratios: dict[str, list[float]], checked: str
) -> None:
    """finish_fix with metrics and spans on next to finish_fix with both off, this run."""

    def raced(shape: str, what: str) -> None:
        ratio = statistics.median(race_ratios[shape])
        print(
            f"      raced, {what} {ratio:.2f}x ({_rounds(race_ratios[shape])}; "
            f"target >= {_TELEMETRY_TARGET:.2f}x: {_verdict(ratio >= _TELEMETRY_TARGET)})"
        )

    print()
    print(
        "finish_fix with finish_fix_metrics and finish_fix_otlp on (an OTLP receiver listening) next to finish_fix with both off, this run:"
    )
    long = statistics.median(_round_ratios_of(telemetry.round_ratios, alone.round_ratios))
    print(
        f"  (g) one {long_events // 1000}k-event Chat stream: {telemetry.events_per_second:,.0f} vs {alone.events_per_second:,.0f} "
        f"events/s (medians); paired {long:.2f}x; mitmdump CPU {telemetry.cpu_us_per_event:.1f} vs {alone.cpu_us_per_event:.1f} us/event"
    )
    raced("telemetry long", "both streaming it at once on one CPU:")
    assert telemetry.concurrent_ratio is not None and alone.concurrent_ratio is not None
    print(
        f"      {concurrent_streams} concurrent: {telemetry.streams_per_second:,.1f} vs {alone.streams_per_second:,.1f} streams/s "
        f"(medians); mitmdump CPU {telemetry.concurrent_cpu_us_per_event:.1f} vs {alone.concurrent_cpu_us_per_event:.1f} us/event"
    )
    raced("telemetry concurrent", f"{concurrent_streams} streams through each at once on one CPU: events")
    print(f"      {checked}")


def _round_ratios_of(ratios: list[float], baseline_ratios: list[float]) -> list[float]:
    """Per round, one path's ratio over another's (both against the same baseline in that round)."""
    return [ratio / base for ratio, base in zip(ratios, baseline_ratios)]


def telemetry_check(mitmdump: Mitmdump, receiver: OtlpReceiver) -> str:
    """What finish_fix with metrics and spans on counted and sent; raises RuntimeError when it counted
    or sent nothing (its ratio would then be that of a configuration that did no such work)."""
    url = metrics_url_in(mitmdump.output)
    if url is None:
        raise RuntimeError(f"finish_fix with metrics on never said where it serves them:\n{mitmdump.output}")
    scraped = httpx.get(url, timeout=10, trust_env=False).text
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in scraped.splitlines() if line.startswith("finish_fix_streams_total{"))
    spans = receiver.wait_for(1, 30)
    if not counted or receiver.errors:
        raise RuntimeError(
            f"finish_fix with metrics and spans on counted {counted:.0f} flows, the receiver refused {receiver.errors}"
        )
    return f"checked: its /metrics counted {counted:,.0f} flows; the receiver had decoded {len(spans):,} of their spans by then"


def add_dialect_option(parser: argparse.ArgumentParser, text: str = "a dialect (repeatable; default all)") -> None:
    """The bench tools' `--dialect`: repeatable, one of `BENCH_DIALECTS`; `chosen_dialects` reads it."""
    parser.add_argument("--dialect", action="append", choices=[str(dialect) for dialect in BENCH_DIALECTS], help=text)


def chosen_dialects(args: argparse.Namespace) -> list[Dialect]:
    """The dialects `--dialect` named, in the bench's order; every one when it was not given."""
    return [dialect for dialect in BENCH_DIALECTS if args.dialect is None or str(dialect) in args.dialect]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_dialect_option(
        parser,
        "a dialect to measure (repeatable; default all four): chat runs every Chat "
        "shape, messages, responses and gemini their long stream, their concurrent shape (raced) and the core",
    )
    parser.add_argument("--events", type=int, default=100_000, help="events in the long stream (each dialect)")
    parser.add_argument("--short-events", type=int, default=10_000, help="events in the short stream whose peak RSS is compared")
    parser.add_argument("--ttfe-runs", type=int, default=9, help="short streams per TTFE median")
    parser.add_argument(
        "--long-runs", type=int, default=5, help="long streams per configuration and dialect (events/s is their median)"
    )
    parser.add_argument("--concurrent-streams", type=int, default=200, help="streams at once in the concurrent shape")
    parser.add_argument("--concurrent-events", type=int, default=200, help="events per stream in the concurrent shape")
    parser.add_argument(
        "--concurrent-runs", type=int, default=5, help="rounds of the concurrent shape (its figures are their median)"
    )
    parser.add_argument(
        "--race-runs",
        type=int,
        default=5,
        help="rounds of each race (every dialect's long stream and concurrent shape) "
        "through plain mitmdump and finish_fix at once",
    )
    parser.add_argument("--skip-buffering", action="store_true", help="leave out plain mitmdump with default (buffering) options")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the processes where the scheduler puts them (default: the client "
        "and upstream on one CPU, every mitmdump on another)",
    )
    args = parser.parse_args(argv)
    dialects = chosen_dialects(args)
    chat = Dialect.CHAT in dialects
    others = [dialect for dialect in dialects if dialect is not Dialect.CHAT]

    if not FINISH_FIX_SCRIPT.exists():
        print(f"error: {FINISH_FIX_SCRIPT} does not exist", file=sys.stderr)
        return 1
    with UpstreamServer() as upstream, tempfile.TemporaryDirectory() as confdir_name, running_otlp_receiver() as receiver:
        confdir = Path(confdir_name)

        def served(dialect: Dialect, pieces: list[bytes], *, batched: bool = True) -> Route:
            prefix = upstream.route(Script(pieces=pieces, write_batch_bytes=_WRITE_BATCH if batched else 0))
            return Route(f"{prefix}{API[dialect][0]}", dialect, UpstreamBody.of(pieces))

        # Built once, so generating events costs the upstream nothing while it sends.
        building = time.perf_counter()
        long_pieces = {dialect: dialect_stream(dialect, args.events) for dialect in dialects}
        print(
            f"built the {', '.join(map(str, dialects))} streams of {args.events:,} events in "
            f"{time.perf_counter() - building:.1f} s",
            file=sys.stderr,
        )
        long_routes = {dialect: served(dialect, long_pieces[dialect]) for dialect in dialects}
        # The concurrent shape of the other dialects, raced like Chat's: many short streams make the
        # per-stream work (the request's facts, learning the shape, the books) show.
        concurrent_routes = {dialect: served(dialect, dialect_stream(dialect, args.concurrent_events)) for dialect in others}
        chat_routes = (
            {
                "long": long_routes[Dialect.CHAT],
                "short": served(Dialect.CHAT, list(healthy_stream(args.short_events)())),
                "tiny": served(Dialect.CHAT, list(healthy_stream(1)()), batched=False),
                "concurrent": served(Dialect.CHAT, list(healthy_stream(args.concurrent_events)())),
            }
            if chat
            else {}
        )

        configurations: list[tuple[str, list[Path], dict[str, str]]] = [
            ("mitmdump (reverse, stream_large_bodies=1)", [], {"stream_large_bodies": "1"}),
            ("mitmdump -s addons/finish_fix.py (reverse)", [FINISH_FIX_SCRIPT], {}),
        ]
        if chat:  # the rows only Chat's table has
            configurations.append(
                ("  same, finish_fix_body_copy=0 (no copy)", [FINISH_FIX_SCRIPT], {"finish_fix_body_copy": "0"})
            )
            if not args.skip_buffering:
                configurations.append(("mitmdump (reverse, defaults: buffers body)", [], {}))
            configurations.append(
                (
                    _TELEMETRY_ROW,
                    [FINISH_FIX_SCRIPT],
                    {"finish_fix_metrics": "127.0.0.1:0", "finish_fix_otlp": receiver.endpoint},
                )
            )

        targets = [Target("direct, no proxy (reference)", upstream.port, None, concurrent=True)]
        try:
            for name, scripts, options in configurations:
                mitmdump = mitmdump_process.start(
                    confdir=confdir,
                    mode=f"reverse:{upstream.origin}",
                    scripts=scripts,
                    options={"flow_detail": "0", **options},
                )
                # The buffering mitmdump is not a streaming proxy: it has no place in that shape.
                streaming = bool(scripts) or "stream_large_bodies" in options
                assert mitmdump.port is not None  # `start` waited until it listened
                targets.append(Target(name, mitmdump.port, mitmdump, concurrent=streaming))
            # Plain streaming mitmdump and finish_fix, the two every ratio compares.
            plain, finish_fix = targets[1], targets[2]
            pinned = (
                None
                if args.no_pin
                else pin_processes(os.getpid(), [target.mitmdump.pid for target in targets if target.mitmdump is not None])
            )
            print(
                f"streaming {args.events:,} events ({', '.join(map(str, dialects))}) through "
                f"{len(targets) if chat else 2} paths, {args.long_runs} rounds ({pinned or 'not pinned'}) ...",
                file=sys.stderr,
            )
            if chat:
                measure(
                    targets,
                    chat_routes,
                    ttfe_runs=args.ttfe_runs,
                    long_runs=args.long_runs,
                    concurrent_streams=args.concurrent_streams,
                    concurrent_runs=args.concurrent_runs,
                )
            for dialect in others:
                long_rounds([plain, finish_fix], long_routes[dialect], rounds=args.long_runs)
            # The races: plain streaming mitmdump and finish_fix at once, every shape in every round;
            # and finish_fix alone against finish_fix with metrics and spans on.
            races = [(str(dialect), long_routes[dialect], 1, plain, finish_fix) for dialect in others]
            races += [
                (f"{dialect} concurrent", concurrent_routes[dialect], args.concurrent_streams, plain, finish_fix)
                for dialect in others
            ]
            if chat:
                telemetry = targets[-1]
                races[:0] = [
                    ("long", chat_routes["long"], 1, plain, finish_fix),
                    ("concurrent", chat_routes["concurrent"], args.concurrent_streams, plain, finish_fix),
                    ("telemetry long", chat_routes["long"], 1, finish_fix, telemetry),
                    ("telemetry concurrent", chat_routes["concurrent"], args.concurrent_streams, finish_fix, telemetry),
                ]
            race_ratios: dict[str, list[float]] = {shape: [] for shape, *_ in races}
            for round_number in range(args.race_runs):
                for shape, route, streams_each, base, raced in races:
                    # Every other round the other one's request goes out first.
                    ports = [base.port, raced.port][:: 1 if round_number % 2 == 0 else -1]
                    events = dict(zip(ports, race(ports, route, streams_each=streams_each)))
                    race_ratios[shape].append(events[raced.port] / events[base.port])
                    time.sleep(0.5)  # the streams left unfinished are torn down before the next race
            checked = ""
            if chat:
                assert telemetry.mitmdump is not None
                checked = telemetry_check(telemetry.mitmdump, receiver)
        except BaseException:
            for target in targets:
                if target.mitmdump is not None:
                    print(f"--- {target.name} ---\n{target.mitmdump.output}", file=sys.stderr)
            raise
        finally:
            for target in targets:
                if target.mitmdump is not None:
                    target.mitmdump.stop()
        rows = None
        if chat:
            rows = [target.row(targets[1]) for target in targets]
            print_table(
                rows,
                rows[1],
                long_events=args.events,
                short_events=args.short_events,
                long_bytes=long_routes[Dialect.CHAT].body.size,
                ttfe_runs=args.ttfe_runs,
                long_runs=args.long_runs,
                pinned=pinned,
            )
            print_concurrent_table(
                rows, streams=args.concurrent_streams, events=args.concurrent_events, runs=args.concurrent_runs
            )
        # The core last, with the proxies stopped, so nothing else of this bench runs meanwhile.
        core = {
            dialect: (
                core_events_per_second(long_pieces[dialect], fast_path=True, dialect=dialect),
                core_events_per_second(long_pieces[dialect], fast_path=False, dialect=dialect),
            )
            for dialect in dialects
        }
        print_targets(
            long_events=args.events,
            chat=(rows[1], rows[2]) if rows else None,
            concurrent_streams=args.concurrent_streams,
            concurrent_events=args.concurrent_events,
            dialects={dialect: (plain.paired(plain, dialect), finish_fix.paired(plain, dialect)) for dialect in others},
            core=core,
            race_ratios=race_ratios,
        )
        if rows is not None:
            print_telemetry(
                long_events=args.events,
                concurrent_streams=args.concurrent_streams,
                telemetry=rows[-1],
                alone=rows[2],
                race_ratios=race_ratios,
                checked=checked,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
