"""finishline's two console commands: `finish-fix` (mitmdump with the finish_fix addon loaded) and
`finishline grade ...` (the graders' command line).

    finish-fix --mode reverse:http://127.0.0.1:8400 -p 8080 --set finish_fix_idle_timeout=5
    finish-fix --addon-path        # the addon's script, for `mitmdump -s` or `mitmweb -s`
    finishline grade server --url http://127.0.0.1:8000/v1

`finish-fix` passes every argument to mitmdump unchanged, after `-s <the addon's script>`; the exit
status is mitmdump's. mitmdump is run in this process, by the same function as the `mitmdump`
command of the environment `finish-fix` is installed in (`mitmproxy.tools.main.mitmdump`): it is
always that environment's mitmproxy, the exact version finish_fix is pinned to, never another
`mitmdump` on PATH, and on every platform (a script folder next to `sys.executable` is not where pip
puts scripts for every scheme).

`finishline grade gateway|server ...` is `python -m labs.grade ...` (the same parser, options and
exit statuses: 0 passed, 1 a check failed, 2 could not run). It is also the one check that
finishline's `labs` and `faults` are the ones Python would import (`maybe_shadowed`): they are
common names, and a project that has its own (found first on sys.path, or imported already) hides
ours. The pytest plugin (`finishline.pytest_plugin`) asks it before it imports the graders, and so
does this command, so both say so in one line rather than fail with a ModuleNotFoundError deep
inside an import.

A console script's module: at import time it reads only the standard library and the core (also
standard library only); mitmproxy once it runs mitmdump, the graders once it grades.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["COMMANDS", "addon_path", "finish_fix", "finishline", "maybe_shadowed"]

#: The only argument of `finish-fix` itself; mitmdump has no option of that name.
ADDON_PATH_FLAG = "--addon-path"
#: The subcommands of `finishline`.
COMMANDS = ("grade",)
#: finishline's packages beside this one, each with a file only finishline's has: a package of that
#: name without it is someone else's. (`finishline` itself is ours: this module is in it.)
OUR_PACKAGES = {"labs": "grade/cli.py", "faults": "toxiproxy_server.py"}


def addon_path() -> Path:
    """The finish_fix addon's script in this package, `finishline/addon/finish_fix.py`: the file to
    give `mitmdump -s` or `mitmweb -s` wherever finishline is importable (an installed wheel, or a
    checkout's venv). A checkout also has `addons/finish_fix.py`, which a stock mitmproxy loads
    without installing anything; both make the same addon."""
    return Path(__file__).resolve().parent / "addon" / "finish_fix.py"


def finish_fix(argv: list[str] | None = None) -> int:
    """`finish-fix [MITMDUMP ARGUMENTS]` or `finish-fix --addon-path`; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    script = addon_path()
    if ADDON_PATH_FLAG in arguments:
        if arguments != [ADDON_PATH_FLAG]:
            return _refuse(
                f"{ADDON_PATH_FLAG} takes no other argument (got {' '.join(arguments)}); "
                f"run `finish-fix {ADDON_PATH_FLAG}` alone, or `finish-fix MITMDUMP-ARGUMENTS`"
            )
        print(script)
        return 0
    if not script.is_file():
        return _refuse(f"the finish_fix addon is missing from this install: no {script}; reinstall finishline")
    try:
        # Here, not at the top: `finish-fix --addon-path` and the plugin's import stay standard library only.
        from mitmproxy.tools.main import mitmdump
    except ImportError as error:
        return _refuse(f"finish-fix needs mitmproxy in its environment ({sys.executable}): {error}; reinstall finishline")
    # Its usage and error lines name sys.argv[0], which is `finish-fix` here.
    return mitmdump(["-s", str(script), *arguments]) or 0


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


def finishline(argv: list[str] | None = None) -> int:
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
    # Lazy: the graders (trio, httpx, the lab) load only when `finishline grade` runs, never for `--help`.
    from labs.grade.cli import main as grade

    return grade(arguments[1:])


def _refuse(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return 2
