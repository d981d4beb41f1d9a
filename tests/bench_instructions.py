"""Instructions per stream of plain streaming mitmdump and of finish_fix, counted by valgrind's
callgrind on the concurrent shape: `python -m tests.bench_instructions`.

The races (`make bench`, `tests.bench_versus`) measure time, which on a shared machine drifts and
which two processes sharing one CPU split by their caches as much as by their work; an instruction
count does not drift. Each mitmdump runs alone under callgrind (about fifty times slower) with
counting off while it starts and warms up (two rounds of the shape), then on for `--streams`
streams, `--at-once` at a time, the same healthy 200-event streams as the bench's. With `--cache`
callgrind also simulates the caches and prints each mitmdump's level-1 misses per stream (what
separates equal counts of instructions in time). Needs valgrind (Debian's `valgrind` package); it is
a developer's tool, not part of `make bench` or the tests. docs/bench.md says what it showed.

Run it on a quiet machine: a mitmdump fifty times slower that also shares its CPU may take longer
than the upstream's 30 s to send on a request of the 200 (`tests/upstream_server.py`), which then
ends as an HTTP 502 and stops the run; `--at-once 50` asks less of it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from faults.child_processes import START_DEADLINE_S, free_port, run_child, start_child
from finishline import Dialect
from tests.bench import (
    _WRITE_BATCH,
    API,
    Route,
    UpstreamBody,
    _read_at_once,
    add_dialect_option,
    chosen_dialects,
    dialect_stream,
)
from tests.mitmdump_process import FINISH_FIX_SCRIPT, mitmdump_executable
from tests.upstream_server import Script, UpstreamServer

_WARM_UP_ROUNDS = 2


@dataclass(frozen=True)
class Counts:
    """What callgrind counted while counting was on, per stream: its events by name (`Ir` is
    instructions; with the cache simulated also `I1mr`, `D1mr`, `D1mw`, ...)."""

    per_stream: dict[str, float]


def _totals(out_prefix: Path) -> dict[str, int]:
    """The event totals of callgrind's dumps (`--callgrind-out-file` prefix; a dump per request)."""
    totals: dict[str, int] = {}
    for dump in out_prefix.parent.glob(out_prefix.name + "*"):
        names: list[str] = []
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("summary:", "totals:")) and names:
                for name, value in zip(names, line.split()[1:]):
                    totals[name] = max(totals.get(name, 0), int(value))
    return totals


def _control(command: str, pid: int) -> None:
    result = run_child(["callgrind_control", command, str(pid)], timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"callgrind_control {command} failed: {result.stderr.strip() or result.stdout.strip()}")


def count(
    route: Route, origin: str, *, scripts: list[Path], options: dict[str, str], streams: int, at_once: int, cache: bool
) -> Counts:
    """One mitmdump (reverse to `origin`) under callgrind, counted over `streams` streams of `route`."""
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        out_prefix = Path(work) / "callgrind.out"
        args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_prefix}"]
        args += ["--cache-sim=yes"] if cache else []
        args += [str(mitmdump_executable()), "--set", f"confdir={work}", "--listen-host", "127.0.0.1"]
        args += ["--listen-port", str(port), "--mode", f"reverse:{origin}", "--set", "flow_detail=0"]
        for script in scripts:
            args += ["-s", str(script)]
        for name, value in options.items():
            args += ["--set", f"{name}={value}"]
        with start_child(args, name="mitmdump under callgrind", log_path=Path(work) / "mitmdump.log") as process:
            # Under valgrind mitmdump starts some fifty times slower than it does alone.
            process.wait_until_listening(port, timeout=START_DEADLINE_S * 10)
            for _ in range(_WARM_UP_ROUNDS):
                _read_at_once([port] * at_once, route)
            _control("--instr=on", process.pid)
            done = 0
            while done < streams:
                _read_at_once([port] * at_once, route)
                done += at_once
            _control("--instr=off", process.pid)
            _control("--dump", process.pid)
        totals = _totals(out_prefix)
    if not totals.get("Ir"):
        raise RuntimeError("callgrind counted nothing (is the valgrind version able to dump on request?)")
    return Counts({name: value / done for name, value in totals.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_dialect_option(parser)
    parser.add_argument("--streams", type=int, default=200, help="streams counted (default 200)")
    parser.add_argument("--at-once", type=int, default=200, help="streams at once (default 200, the bench's concurrent shape)")
    parser.add_argument("--events", type=int, default=200, help="events per stream (default 200)")
    parser.add_argument("--cache", action="store_true", help="simulate the caches too (slower) and print level-1 misses")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("error: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    for option in ("streams", "at_once", "events"):
        if getattr(args, option) < 1:
            print(f"error: --{option.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    dialects = chosen_dialects(args)
    shown = ["Ir", "I1mr", "D1mr", "D1mw"] if args.cache else ["Ir"]
    print(f"per stream ({args.streams} streams of {args.events} events, {args.at_once} at once), in thousands; Ir = instructions")
    with UpstreamServer() as upstream:
        for dialect in dialects:
            pieces = dialect_stream(Dialect(dialect), args.events)
            prefix = upstream.route(Script(pieces=pieces, write_batch_bytes=_WRITE_BATCH))
            route = Route(f"{prefix}{API[dialect][0]}", dialect, UpstreamBody.of(pieces))
            common = dict(streams=args.streams, at_once=args.at_once, cache=args.cache)
            plain = count(route, upstream.origin, scripts=[], options={"stream_large_bodies": "1"}, **common)
            fixed = count(route, upstream.origin, scripts=[FINISH_FIX_SCRIPT], options={}, **common)
            for name in shown:
                before, after = plain.per_stream.get(name, 0.0), fixed.per_stream.get(name, 0.0)
                ratio = f"{after / before:.3f}x" if before else "n/a"
                print(
                    f"  {dialect:<9} {name:<5} plain mitmdump {before / 1e3:10,.0f}k   finish_fix {after / 1e3:10,.0f}k   {ratio}"
                )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
