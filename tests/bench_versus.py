"""Two versions of finish_fix raced against plain mitmdump in one sitting: `python -m tests.bench_versus`.

Not a test: it asserts nothing about speed. A change to per-stream work moves the concurrent races
(`tests.bench`) by less than the drift between two runs minutes apart, so its worth is measured
here with both versions at once: this checkout's finish_fix ("after") and another copy of the
`addons/` folder ("before", e.g. `git archive main addons | tar -x -C /tmp/before`), each in its
own mitmdump, and plain streaming mitmdump. Each round races plain mitmdump against one version,
then against the other (which goes first alternates, and so does whose requests go out first),
200 streams of 200 events through each at once, as `tests.bench` races them (`race`, every body
checked against the upstream's). The medians and every round's ratio are printed.

With `--before` this checkout's own `addons/`, both sides run the same code (an A/A run): the
difference between its two medians is what the machine's drift alone gives, the resolution of the
before/after figures taken in the same minutes (docs/bench.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from finishline import Dialect
from tests import mitmdump_process
from tests.bench import (
    _WRITE_BATCH,
    API,
    Route,
    UpstreamBody,
    add_dialect_option,
    chosen_dialects,
    dialect_stream,
    pin_processes,
    race,
)
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump
from tests.upstream_server import Script, UpstreamServer


def _start(confdir: Path, origin: str, scripts: list[Path], options: dict[str, str], pythonpath: str | None) -> Mitmdump:
    """A reverse mitmdump; `pythonpath` first on its path, so that its `finishline` is that folder's."""
    saved = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    try:
        return mitmdump_process.start(
            confdir=confdir, mode=f"reverse:{origin}", scripts=scripts, options={"flow_detail": "0", **options}
        )
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="an `addons/` folder of the version to compare with")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (every dialect's race through both versions in each)")
    add_dialect_option(parser)
    parser.add_argument("--streams", type=int, default=200, help="streams through each proxy at once")
    parser.add_argument("--events", type=int, default=200, help="events per stream")
    args = parser.parse_args(argv)
    before_script = args.before / FINISH_FIX_SCRIPT.name
    if not before_script.exists():
        print(f"error: {before_script} does not exist (--before names an addons/ folder)", file=sys.stderr)
        return 2
    dialects = chosen_dialects(args)
    with UpstreamServer() as upstream, tempfile.TemporaryDirectory() as confdir_name:
        confdir = Path(confdir_name)
        routes: dict[Dialect, Route] = {}
        for dialect in dialects:
            pieces = dialect_stream(dialect, args.events)
            prefix = upstream.route(Script(pieces=pieces, write_batch_bytes=_WRITE_BATCH))
            routes[dialect] = Route(f"{prefix}{API[dialect][0]}", dialect, UpstreamBody.of(pieces))
        plain = _start(confdir, upstream.origin, [], {"stream_large_bodies": "1"}, None)
        versions = {
            "before": _start(confdir, upstream.origin, [before_script], {}, str(args.before.resolve())),
            "after": _start(confdir, upstream.origin, [FINISH_FIX_SCRIPT], {}, None),
        }
        proxies = [plain, *versions.values()]
        try:
            pinned = pin_processes(os.getpid(), [proxy.pid for proxy in proxies])
            print(pinned or "not pinned", file=sys.stderr)
            ratios: dict[tuple[Dialect, str], list[float]] = {(d, name): [] for d in dialects for name in versions}
            for round_number in range(args.rounds):
                for dialect in dialects:
                    for name, proxy in list(versions.items())[:: 1 if round_number % 2 == 0 else -1]:
                        assert plain.port is not None and proxy.port is not None  # `start` waited for both
                        ports = [plain.port, proxy.port][:: 1 if (round_number // 2) % 2 == 0 else -1]
                        events = dict(zip(ports, race(ports, routes[dialect], streams_each=args.streams)))
                        ratios[(dialect, name)].append(events[proxy.port] / events[plain.port])
                        time.sleep(0.5)  # the streams left unfinished are torn down before the next race
                print(
                    f"round {round_number}: "
                    + "  ".join(f"{d} {ratios[(d, 'before')][-1]:.2f}/{ratios[(d, 'after')][-1]:.2f}" for d in dialects),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for proxy in proxies:
                proxy.stop()
    print(f"{args.streams} x {args.events} raced against plain streaming mitmdump, medians of {args.rounds} rounds:")
    for dialect in dialects:
        before, after = ratios[(dialect, "before")], ratios[(dialect, "after")]
        print(
            f"  {dialect:<9} before {statistics.median(before):.3f}x  after {statistics.median(after):.3f}x"
            f"   (rounds: before {' '.join(f'{r:.2f}' for r in before)}; after {' '.join(f'{r:.2f}' for r in after)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
