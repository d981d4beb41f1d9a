"""`finishline grade gateway|server ...`: the graders' command, the same as `python -m labs.grade ...`
(the same parser, options and exit statuses: 0 passed, 1 a check failed, 2 could not run).

Also the one check that finishline's own packages are the ones Python would import
(`maybe_shadowed`): `labs` and `faults` are common names, and a project that has its own (found
first on sys.path, or imported already) hides ours. The pytest plugin (finishline_pytest) asks it
before it imports the graders, and so does this command, so both say so in one line rather than
fail with a ModuleNotFoundError deep inside an import.

Why this module is here, and not in `finishline`: the core stays the sans-IO repair and knows
nothing of the lab; this is a console script's module next to it in `addons/` (whose contents are
the wheel's top level, pyproject.toml), importing only the standard library at import time.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["COMMANDS", "main", "maybe_shadowed"]

#: The subcommands of `finishline`.
COMMANDS = ("grade",)
#: finishline's packages, each with a file only finishline's has: a package of that
#: name without it is someone else's.
OUR_PACKAGES = {"labs": "grade/cli.py", "faults": "toxiproxy_server.py", "finishline": "_repair.py"}


def maybe_shadowed() -> str | None:
    """Why finishline's packages cannot be imported, as a clause for a one-line error ("`labs` here
    is /project/labs/__init__.py, not finishline's `labs` package, which it hides"); None when
    Python would import finishline's own."""
    for name, marker in OUR_PACKAGES.items():
        # A top-level name is found without running any code; one imported already gives its own spec.
        spec = importlib.util.find_spec(name)
        if spec is None:
            return f"finishline's `{name}` package is not importable by {sys.executable}"
        folders = [Path(folder) for folder in spec.submodule_search_locations or ()]
        if not any((folder / marker).is_file() for folder in folders):
            where = spec.origin if spec.origin and spec.origin != "namespace" else ", ".join(map(str, folders))
            return f"`{name}` here is {where}, not finishline's `{name}` package, which it hides"
    return None


def main(argv: list[str] | None = None) -> int:
    """`finishline grade ...`; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] in (["-h"], ["--help"]):
        print("usage: finishline grade {gateway,server,lab-gateways} ...   (finishline grade --help for more)")
        return 0
    if not arguments or arguments[0] not in COMMANDS:
        given = f"{arguments[0]!r} is not a finishline command" if arguments else "no command given"
        print(f"error: {given}; commands: {', '.join(COMMANDS)} (finishline grade gateway|server ...)", file=sys.stderr)
        return 2
    if (shadowed := maybe_shadowed()) is not None:
        print(f"error: finishline grade cannot run: {shadowed} (is its folder on PYTHONPATH?)", file=sys.stderr)
        return 2
    from labs.grade.cli import main as grade

    return grade(arguments[1:])


if __name__ == "__main__":
    sys.exit(main())
