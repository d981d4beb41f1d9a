"""Where this install of finishline keeps its parts, and whether its packages are the ones Python
imports: what the console commands (`finishline.commands`), the pytest plugin and the lab ask, in a
module of its own so that none of them imports a command line to learn it. Standard library only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["OUR_PACKAGES", "addon_path", "maybe_shadowed"]

#: finishline's packages beside this one, each with a file only finishline's has: a package of that
#: name without it is someone else's. (`finishline` itself is ours: this module is in it.)
OUR_PACKAGES = {"labs": "grade/cli.py", "faults": "toxiproxy_server.py"}


def addon_path() -> Path:
    """The finish_fix addon's script in this package, `finishline/addon/finish_fix.py`: the file to
    give `mitmdump -s` or `mitmweb -s` wherever finishline is importable (an installed wheel, or a
    checkout's venv). A checkout also has `addons/finish_fix.py`, which a stock mitmproxy loads
    without installing anything; both make the same addon."""
    return Path(__file__).resolve().parent / "addon" / "finish_fix.py"


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
