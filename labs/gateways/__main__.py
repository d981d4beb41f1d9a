"""`python -m labs.gateways`: every gateway the lab knows, whether it is installed here (or what
to do about it), and what it is."""

from __future__ import annotations

from collections.abc import Sequence

from faults.cli_parser import OneLineParser
from labs.gateways.registry import EXTERNAL, entries


def build_parser() -> OneLineParser:
    return OneLineParser(
        prog="python -m labs.gateways",
        description="List every gateway the lab knows: whether it is installed here (or what to do "
        "about it), whether it takes the spare worker, and what it is. Takes no arguments.",
    )


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    width = max(len(name) for name in entries())
    for name, entry in entries().items():
        problem = entry.missing()
        status = "yours: the lab does not start it" if name == EXTERNAL else f"missing: {problem}" if problem else "installed"
        if entry.uses_spare and not problem:
            status += "; takes the spare worker"
        print(f"{name:{width}}  {status}")
        print(f"{'':{width}}  {entry.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
