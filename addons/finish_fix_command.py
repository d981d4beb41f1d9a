"""`finish-fix`: mitmdump with the finish_fix addon loaded; and where the addon is.

    finish-fix --mode reverse:http://127.0.0.1:8400 -p 8080 --set finish_fix_idle_timeout=5
    finish-fix --addon-path        # the addon's file, for `mitmdump -s` or `mitmweb -s`

Every argument goes to mitmdump unchanged, after `-s <the addon>`; the exit status is mitmdump's.
mitmdump is run in this process, by the same function as the `mitmdump` command of the environment
`finish-fix` is installed in (`mitmproxy.tools.main.mitmdump`): it is always that environment's
mitmproxy, the exact version finish_fix is pinned to, never another `mitmdump` on PATH, and on every
platform (a script folder next to `sys.executable` is not where pip puts scripts for every scheme).

Why this module is here: it sits next to `finish_fix.py` in `addons/`, and the wheel puts the
contents of `addons/` at its top level (pyproject.toml), so `addon_path()` is the file next to this
one in a checkout and once installed alike. It is a console script's module, so it imports only
the standard library at import time; mitmproxy only once it runs mitmdump.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["addon_path", "main"]

#: The only argument of `finish-fix` itself; mitmdump has no option of that name.
ADDON_PATH_FLAG = "--addon-path"


def addon_path() -> Path:
    """The finish_fix addon's script, `finish_fix.py`: the file to give `mitmdump -s` or `mitmweb -s`.

    Its folder also holds its sibling modules and the core, which the script imports.
    """
    return Path(__file__).resolve().with_name("finish_fix.py")


def main(argv: list[str] | None = None) -> int:
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
        from mitmproxy.tools.main import mitmdump
    except ImportError as error:
        return _refuse(f"finish-fix needs mitmproxy in its environment ({sys.executable}): {error}; reinstall finishline")
    # Its usage and error lines name sys.argv[0], which is `finish-fix` here.
    return mitmdump(["-s", str(script), *arguments]) or 0


def _refuse(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
