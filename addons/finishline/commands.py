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
finishline's `labs` and `faults` are the ones Python would import (`finishline.install.maybe_shadowed`): they are
common names, and a project that has its own (found first on sys.path, or imported already) hides
ours. The pytest plugin (`finishline.pytest_plugin`) asks it before it imports the graders, and so
does this command, so both say so in one line rather than fail with a ModuleNotFoundError deep
inside an import.

A console script's module: at import time it reads only the standard library and the core (also
standard library only); mitmproxy once it runs mitmdump, the graders once it grades.
"""

from __future__ import annotations

import sys

from finishline.install import addon_path, maybe_shadowed

__all__ = ["COMMANDS", "finish_fix", "finishline"]

#: The only argument of `finish-fix` itself; mitmdump has no option of that name.
ADDON_PATH_FLAG = "--addon-path"
#: The subcommands of `finishline`.
COMMANDS = ("grade",)


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
