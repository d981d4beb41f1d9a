"""`langchain` in Gemini: LangChain's `ChatGoogleGenerativeAI` (langchain-google-genai 4.4.2), run by
the Python host started from its own environment (`.tools/clients/langchain-google`: it needs
google-genai below 3, the lab has 3.3.0), labs/clients/python_langchain_google.py.

Without a process: where the name runs in each dialect, and a missing environment refused in one
line before any host starts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from faults.child_processes import ChildStartError
from finishline import Dialect
from labs.clients import OWN_ENVIRONMENTS, runtime_of
from labs.clients import hosts as client_hosts
from labs.clients.hosts import CLIENT_ENV_PINS, CLIENT_REQUIREMENTS, missing_client_env, open_driver_hosts
from labs.clients.python_drivers import DRIVERS, PACKAGES
from labs.clients.python_host import PRELOAD, run
from tests.fixtures_lab import run_trio


def test_langchain_runs_in_its_own_environment_in_gemini_and_in_the_labs_elsewhere():
    assert runtime_of("langchain", Dialect.GEMINI) == "langchain-google"
    assert {runtime_of("langchain", dialect) for dialect in (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)} == {"python"}
    assert runtime_of("langchain") == "python"


def test_every_environment_of_its_own_has_a_pin_a_requirements_file_packages_and_a_driver():
    for (client, dialect), runtime in OWN_ENVIRONMENTS.items():
        assert runtime in CLIENT_ENV_PINS
        assert (CLIENT_REQUIREMENTS / f"{runtime}.txt").is_file()
        # The pin the install check names is the one the requirements file installs.
        assert CLIENT_ENV_PINS[runtime] + " \\" in (CLIENT_REQUIREMENTS / f"{runtime}.txt").read_text()
        assert runtime in PACKAGES
        assert (client, dialect) in DRIVERS and (client, dialect) in PRELOAD


def test_the_environment_made_by_make_setup_passes_its_install_check():
    # `make setup` ran before the tests (make test depends on it).
    assert missing_client_env("langchain-google") is None


def test_a_missing_environment_is_one_line_before_any_host_starts(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(client_hosts, "CLIENT_ENVS", tmp_path / "nothing")

    async def start() -> None:
        # openai-python's host (the lab's environment) would start first if the check came late.
        async with open_driver_hosts(("openai-python", "langchain"), tmp_path, (Dialect.CHAT, Dialect.GEMINI)):
            raise AssertionError("started")

    with pytest.raises(ChildStartError) as refused:
        run_trio(start)
    python = tmp_path / "nothing" / "langchain-google" / "bin" / "python"
    assert str(refused.value) == (
        f"langchain (langchain-google): langchain-google-genai==4.4.2 is not installed ({python} missing): run `make setup`"
    )
    assert not list(tmp_path.glob("driver-host-*.log"))


def test_an_environment_older_than_its_requirements_says_make_setup(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(client_hosts, "CLIENT_ENVS", tmp_path)
    (tmp_path / "langchain-google" / "bin").mkdir(parents=True)
    (tmp_path / "langchain-google" / "bin" / "python").touch()
    stamp = tmp_path / "langchain-google" / ".installed"
    stamp.touch()
    old = (CLIENT_REQUIREMENTS / "langchain-google.txt").stat().st_mtime - 10
    os.utime(stamp, (old, old))
    assert missing_client_env("langchain-google") == (
        f"langchain-google-genai==4.4.2 in {tmp_path / 'langchain-google'} is older than langchain-google.txt: run `make setup`"
    )


def test_the_labs_python_host_refuses_langchains_gemini_requests():
    # Its library is not in the lab's environment: the host says where it runs instead of failing
    # on an import.
    request = {"id": "c0001", "client": "langchain", "dialect": "gemini", "deadline_s": 10}
    record = asyncio.run(run(request, "python"))
    assert (record["completed"], record["error_class"]) == (False, "LookupError")
    assert record["error_message"] == "langchain in the gemini dialect runs in the langchain-google host, not the python one"
