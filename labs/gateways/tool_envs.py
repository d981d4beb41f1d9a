"""Gateways installed in an environment of their own, `.tools/gateways/NAME` (the Makefile makes
each from the pinned, hashed `labs/gateways/requirements/NAME.txt`), because their dependencies
conflict with the lab's (LiteLLM pins many). The install check of such a gateway is one line.
"""

from __future__ import annotations

from pathlib import Path

from labs.gateways.services import ROOT

GATEWAY_ENVS = ROOT / ".tools" / "gateways"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements"


def tool_binary(env: str, program: str) -> Path:
    return GATEWAY_ENVS / env / "bin" / program


def missing_tool_env(env: str, program: str, pin: str) -> str | None:
    """None when `.tools/gateways/<env>` holds `program`, installed from the current requirements
    file; else one line saying what is missing and how to install it."""
    stamp = GATEWAY_ENVS / env / ".installed"
    requirements = REQUIREMENTS / f"{env}.txt"
    if not tool_binary(env, program).exists() or not stamp.exists():
        return f"{pin} is not installed ({tool_binary(env, program)} missing): run `make setup`"
    if stamp.stat().st_mtime < requirements.stat().st_mtime:
        return f"{pin} in {GATEWAY_ENVS / env} is older than {requirements.name}: run `make setup`"
    return None
