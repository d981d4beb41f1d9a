"""Programs and client libraries installed in an environment of their own under `.tools/`
(`.tools/gateways/NAME` for the routers, `.tools/clients/NAME` for a client library), because their
dependencies conflict with the lab's: the Makefile makes each from a pinned, hashed requirements
file and stamps it `.installed`. Whether one is usable is one check, answered in one line.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TOOLS", "missing_environment"]

#: The checkout's `.tools` folder, where `make setup` puts every environment of its own.
TOOLS = Path(__file__).resolve().parents[1] / ".tools"


def missing_environment(home: Path, program: Path, requirements: Path, pin: str) -> str | None:
    """None when the environment at `home` holds `program` and was installed from the current
    `requirements` (its `.installed` stamp is not older than the file); else one line naming `pin`
    (what the environment is for), what is wrong, and `make setup`, which fixes both."""
    stamp = home / ".installed"
    if not program.exists() or not stamp.exists():
        return f"{pin} is not installed ({program} missing): run `make setup`"
    if stamp.stat().st_mtime < requirements.stat().st_mtime:
        return f"{pin} in {home} is older than {requirements.name}: run `make setup`"
    return None
