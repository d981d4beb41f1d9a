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

The client is a socket with h11 that counts `data: ` marks in the body, so that a full client's
overhead does not hide the proxy's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h11

from tests import mitmdump_process
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump
from tests.chat_streams import chat_chunk, sse_event
from tests.upstream_server import Script, UpstreamServer

_DATA_MARK = b"data: "
_RECV_SIZE = 1 << 20
_DEADLINE_S = 300.0
# The upstream writes its chunks (one event each) in socket writes of this size, as a fast server
# under load does; one write per event would make the Python upstream the bottleneck.
_WRITE_BATCH = 64 * 1024  # one stream; the whole bench has no other limit than the sum of these


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


@dataclass
class StreamRun:
    events: int
    seconds: float
    time_to_first_event: float
    body_bytes: int
    rss_samples_kib: dict[int, int] = field(default_factory=dict)


def read_stream(
    port: int,
    path: str,
    *,
    expected_events: int | None = None,
    sample_at: dict[int, int] | None = None,
    sample_rss: Callable[[], int] | None = None,
) -> StreamRun:
    """POST to 127.0.0.1:`port``path` (Connection: close), read to EOF, count events.

    Args:
        sample_at: {percent: event count}; when the count passes one, `sample_rss()` is recorded.
    """
    body = json.dumps({"model": "bench", "stream": True,
                       "messages": [{"role": "user", "content": "go"}]}).encode()
    client = h11.Connection(h11.CLIENT)
    request = client.send(h11.Request(
        method="POST", target=path,
        headers=[("Host", f"127.0.0.1:{port}"), ("Content-Type", "application/json"),
                 ("Accept", "text/event-stream"), ("Content-Length", str(len(body))),
                 ("Connection", "close")],
    )) + client.send(h11.Data(data=body)) + client.send(h11.EndOfMessage())
    pending = dict(sorted((sample_at or {}).items(), key=lambda item: item[1]))
    samples: dict[int, int] = {}
    events = 0
    received = 0
    first_event_at: float | None = None
    carry = b""  # the end of the previous piece, for a mark split across pieces
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
            data = bytes(event.data)
            received += len(data)
            window = carry + data
            found = window.count(_DATA_MARK)
            if found:
                if first_event_at is None:
                    first_event_at = time.perf_counter()
                events += found
                while pending and events >= next(iter(pending.values())) and sample_rss:
                    percent = next(iter(pending))
                    del pending[percent]
                    samples[percent] = sample_rss()
            carry = window[-(len(_DATA_MARK) - 1) :]
        finished = time.perf_counter()
    if first_event_at is None:
        raise RuntimeError(f"no event came from port {port}{path} ({received} bytes)")
    if expected_events is not None and events != expected_events:
        raise RuntimeError(f"expected {expected_events} events from port {port}, got {events}")
    return StreamRun(events, finished - started, first_event_at - started, received, samples)


@dataclass
class Row:
    name: str
    events_per_second: float
    time_to_first_event_s: float
    long_stream_first_event_s: float
    rss_samples_kib: dict[int, int] = field(default_factory=dict)
    peak_after_short_kib: int | None = None
    peak_after_long_kib: int | None = None


def peak_rss_kib(mitmdump: Mitmdump) -> int:
    status = Path(f"/proc/{mitmdump.pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1))


@dataclass
class Target:
    """One path through which streams are read: a port, and the mitmdump behind it if any."""

    name: str
    port: int
    mitmdump: Mitmdump | None
    tiny_ttfe: list[float] = field(default_factory=list)
    long_runs: list[StreamRun] = field(default_factory=list)
    peak_after_short_kib: int | None = None
    peak_after_long_kib: int | None = None

    def row(self) -> Row:
        return Row(
            name=self.name,
            events_per_second=statistics.median(r.events / r.seconds for r in self.long_runs),
            time_to_first_event_s=statistics.median(self.tiny_ttfe),
            long_stream_first_event_s=statistics.median(
                r.time_to_first_event for r in self.long_runs
            ),
            rss_samples_kib=self.long_runs[0].rss_samples_kib,
            peak_after_short_kib=self.peak_after_short_kib,
            peak_after_long_kib=self.peak_after_long_kib,
        )


def measure(
    targets: list[Target],
    paths: dict[str, str],
    *,
    long_events: int,
    short_events: int,
    ttfe_runs: int,
    long_runs: int,
) -> None:
    """Every measurement round-robin over `targets`, so that load from elsewhere on the machine
    falls on all of them alike rather than on whichever ran during it."""
    for _ in range(ttfe_runs):
        for target in targets:
            target.tiny_ttfe.append(read_stream(target.port, paths["tiny"]).time_to_first_event)
    for target in targets:
        if target.mitmdump is not None:
            read_stream(target.port, paths["short"], expected_events=short_events + 2)
            target.peak_after_short_kib = peak_rss_kib(target.mitmdump)
    marks = {p: long_events * p // 100 for p in (10, 50, 90)}
    for round_number in range(long_runs):
        for target in targets:
            # The first long run of each is the one whose memory is sampled and whose peak is read.
            sampled = round_number == 0 and target.mitmdump is not None
            target.long_runs.append(read_stream(
                target.port,
                paths["long"],
                expected_events=long_events + 2,
                sample_at=marks if sampled else None,
                sample_rss=target.mitmdump.rss_kib if sampled else None,
            ))
            if sampled:
                target.peak_after_long_kib = peak_rss_kib(target.mitmdump)


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def print_table(rows: list[Row], baseline: Row, *, long_events: int, short_events: int,
                long_bytes: int, ttfe_runs: int, long_runs: int) -> None:
    import mitmproxy.version

    print()
    print(f"finish_fix benchmark: a healthy {long_events:,}-event chat stream "
          f"({long_bytes / 1e6:.1f} MB, one event per HTTP chunk) over 127.0.0.1")
    print(f"mitmproxy {mitmproxy.version.VERSION}, Python {platform.python_version()}, "
          f"{platform.machine()}, {platform.system()} {platform.release()}")
    print()
    header = (f"{'path':<44} {'events/s':>10} {'x plain':>8} {'TTFE ms':>8} {'+TTFE ms':>9} "
              f"{'1st of long':>11} {'RSS@10%':>8} {'RSS@50%':>8} {'RSS@90%':>8} {'peak ' + format(short_events // 1000) + 'k':>9} "
              f"{'peak ' + format(long_events // 1000) + 'k':>10}")
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.events_per_second / baseline.events_per_second
        added = (row.time_to_first_event_s - baseline.time_to_first_event_s) * 1000
        print(
            f"{row.name:<44} {row.events_per_second:>10,.0f} {ratio:>8.2f} "
            f"{row.time_to_first_event_s * 1000:>8.2f} {added:>+9.2f} "
            f"{row.long_stream_first_event_s * 1000:>9.1f}ms "
            f"{_mib(row.rss_samples_kib.get(10)):>8} {_mib(row.rss_samples_kib.get(50)):>8} "
            f"{_mib(row.rss_samples_kib.get(90)):>8} {_mib(row.peak_after_short_kib):>9} "
            f"{_mib(row.peak_after_long_kib):>10}"
        )
    print()
    print(f"events/s: median of {long_runs} long streams, taken round-robin over the paths. "
          f"x plain: events/s relative to '{baseline.name}'. TTFE: time to first event, median of "
          f"{ttfe_runs} three-event streams,")
    print("each on a new connection (so it includes mitmdump's upstream connect); +TTFE is against "
          "the same baseline.")
    print("1st of long: time to the first event of the long stream (a buffering proxy sends nothing "
          "until the upstream is done).")
    print("direct: the client reads the upstream itself, one HTTP chunk per event; mitmdump "
          "re-chunks per read, so the client parses fewer")
    print(f"chunks behind it and 'direct' is a reference, not a ceiling. Upstream, mitmdump and "
          f"client share {os.cpu_count()} CPUs.")
    print("RSS in MiB, mitmdump's resident set from /proc/PID/status while the long stream flows "
          "(VmRSS at 10/50/90% of its events);")
    print(f"peak = VmHWM after a {short_events:,}-event stream, then after the {long_events:,}-event "
          "stream, in the same process.")
    print("finish_fix keeps a bounded copy of each stream for mitmweb (finish_fix_body_copy, "
          "default 4MB): expect RSS to rise by up to that much, then stay flat.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the long stream")
    parser.add_argument("--short-events", type=int, default=10_000,
                        help="events in the short stream whose peak RSS is compared")
    parser.add_argument("--ttfe-runs", type=int, default=9, help="short streams per TTFE median")
    parser.add_argument("--long-runs", type=int, default=3,
                        help="long streams per configuration (events/s is their median)")
    parser.add_argument("--skip-buffering", action="store_true",
                        help="leave out plain mitmdump with default (buffering) options")
    args = parser.parse_args(argv)

    if not FINISH_FIX_SCRIPT.exists():
        print(f"error: {FINISH_FIX_SCRIPT} does not exist", file=sys.stderr)
        return 1
    with UpstreamServer() as upstream, tempfile.TemporaryDirectory() as confdir_name:
        confdir = Path(confdir_name)
        # Built once, so generating events costs the upstream nothing while it sends.
        long_pieces = list(healthy_stream(args.events)())
        long_prefix = upstream.route(Script(pieces=long_pieces, write_batch_bytes=_WRITE_BATCH))
        short_prefix = upstream.route(Script(pieces=list(healthy_stream(args.short_events)()),
                                             write_batch_bytes=_WRITE_BATCH))
        tiny_prefix = upstream.route(Script(pieces=list(healthy_stream(1)())))
        paths = {name: f"{prefix}/v1/chat/completions"
                 for name, prefix in (("long", long_prefix), ("short", short_prefix),
                                      ("tiny", tiny_prefix))}
        long_bytes = sum(map(len, long_pieces))

        configurations: list[tuple[str, list[Path], dict[str, str]]] = [
            ("mitmdump (reverse, stream_large_bodies=1)", [], {"stream_large_bodies": "1"}),
            ("mitmdump -s addons/finish_fix.py (reverse)", [FINISH_FIX_SCRIPT], {}),
            ("  same, finish_fix_body_copy=0 (no copy)", [FINISH_FIX_SCRIPT],
             {"finish_fix_body_copy": "0"}),
        ]
        if not args.skip_buffering:
            configurations.append(("mitmdump (reverse, defaults: buffers body)", [], {}))

        targets = [Target("direct, no proxy (reference)", upstream.port, None)]
        try:
            for name, scripts, options in configurations:
                mitmdump = mitmdump_process.start(
                    confdir=confdir, mode=f"reverse:{upstream.origin}", scripts=scripts,
                    options={"flow_detail": "0", **options},
                )
                targets.append(Target(name, mitmdump.port, mitmdump))
            print(f"streaming {args.events:,} events through {len(targets)} paths, "
                  f"{args.long_runs} rounds ...", file=sys.stderr)
            measure(targets, paths, long_events=args.events, short_events=args.short_events,
                    ttfe_runs=args.ttfe_runs, long_runs=args.long_runs)
        except BaseException:
            for target in targets:
                if target.mitmdump is not None:
                    print(f"--- {target.name} ---\n{target.mitmdump.output}", file=sys.stderr)
            raise
        finally:
            for target in targets:
                if target.mitmdump is not None:
                    target.mitmdump.stop()
        rows = [target.row() for target in targets]
        print_table(rows, rows[1], long_events=args.events, short_events=args.short_events,
                    long_bytes=long_bytes, ttfe_runs=args.ttfe_runs, long_runs=args.long_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
