"""Gateways installed in an environment of their own, `.tools/gateways/NAME` (the Makefile makes
each from the pinned, hashed `labs/gateways/requirements/NAME.txt`), because their dependencies
conflict with the lab's (LiteLLM pins many). The install check of such a gateway is one line.
"""

from __future__ import annotations

from pathlib import Path

from labs.own_environments import TOOLS, missing_environment

GATEWAY_ENVS = TOOLS / "gateways"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements"


def tool_binary(env: str, program: str) -> Path:
    return GATEWAY_ENVS / env / "bin" / program


def missing_tool_env(env: str, program: str, pin: str) -> str | None:
    """None when `.tools/gateways/<env>` holds `program`, installed from the current requirements
    file; else one line saying what is missing and how to install it."""
    return missing_environment(GATEWAY_ENVS / env, tool_binary(env, program), REQUIREMENTS / f"{env}.txt", pin)
