"""The version of an npm package installed in one of the lab's `node_modules` folders (the Portkey
gateway's, the coding agents'), read from its own package.json where it lives, never from a lock
file: a stale install then shows what runs, not the pin."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["NOT_INSTALLED", "installed_version"]

NOT_INSTALLED = "not installed"


def installed_version(node_modules: Path, package: str) -> str:
    """`node_modules/<package>/package.json`'s `version`; `not installed` when there is none, and a
    few words when it cannot be read (a missing version never stops a run)."""
    try:
        return str(json.loads((node_modules / package / "package.json").read_text(encoding="utf-8"))["version"])
    except FileNotFoundError:
        return NOT_INSTALLED
    except (OSError, ValueError, KeyError):
        return "unread (package.json)"
