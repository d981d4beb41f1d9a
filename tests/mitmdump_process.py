"""Run a real `mitmdump` subprocess for the end-to-end tests and the benchmark.

mitmdump is the one next to the running interpreter (`.venv/bin/mitmdump`), started with a private
confdir (its CA lands there, never in `~/.mitmproxy`), `--listen-host 127.0.0.1 --listen-port 0`:
the kernel picks a free port and mitmdump prints it, e.g.
`reverse proxy to http://127.0.0.1:4242 listening at 127.0.0.1:40321.`. It is started, its port read
and it is stopped by the one launcher (`faults.child_processes`): the port is the one its own socket
listens on, the line above names which. Its combined stdout/stderr goes to a log file next to the
confdir, so a test can search it and show it when something fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from faults.child_processes import START_DEADLINE_S, ChildProcess, ChildStartError, start_child
from finishline.install import addon_path
from labs.gateways.services import MITM_LISTENING

__all__ = ["MitmdumpError", "Mitmdump", "REPO_ROOT", "FINISH_FIX_SCRIPT", "mitmdump_executable", "running_mitmdump"]

REPO_ROOT = Path(__file__).resolve().parent.parent
FINISH_FIX_SCRIPT = addon_path()

# What mitmdump prints when a `-s` script fails to import, load or configure.
_SCRIPT_FAILED = re.compile(r"error in script|Error logged during startup|Traceback", re.I)


class MitmdumpError(RuntimeError):
    """mitmdump did not start as asked; the message carries its output."""


def mitmdump_executable(program: str = "mitmdump") -> Path:
    """The mitmdump (or `program`, e.g. mitmweb) installed next to this interpreter (.venv)."""
    candidate = Path(sys.executable).parent / program
    if not candidate.exists():
        raise MitmdumpError(f"no {program} next to {sys.executable}; run `make setup`")
    return candidate


@dataclass
class Mitmdump:
    """A started mitmdump process; `port` is where it listens."""

    args: list[str]
    process: ChildProcess
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        """Everything mitmdump printed so far (stdout and stderr, from its log file)."""
        return self.process.log_text()

    def wait_for_output(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait until mitmdump's output matches `pattern`; raise MitmdumpError after `timeout` s."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            exited = self.process.poll() is not None  # before reading: then the output is complete
            if match := regex.search(self.output):
                return match
            if exited:
                raise MitmdumpError(
                    f"mitmdump exited with code {self.process.returncode} before its output "
                    f"matched {regex.pattern!r}{self._describe()}"
                )
            if time.monotonic() > deadline:
                raise MitmdumpError(f"mitmdump output did not match {regex.pattern!r} within {timeout} s{self._describe()}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit by itself; return its code (raises on timeout)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise MitmdumpError(f"mitmdump still running after {timeout} s{self._describe()}") from None

    def stop(self, timeout: float = 10) -> int:
        """SIGTERM (mitmdump's clean shutdown: addons get `done`), then SIGKILL if it hangs."""
        return self.process.stop(grace=timeout)

    def rss_kib(self) -> int:
        """Resident set size of the mitmdump process now, from /proc (KiB)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        if match is None:
            raise MitmdumpError(f"no VmRSS in /proc/{self.pid}/status")
        return int(match.group(1))

    def _describe(self) -> str:
        return f"\ncommand: {' '.join(self.args)}\n--- mitmdump output ---\n{self.output}"


def start(
    *,
    confdir: Path,
    mode: str = "regular",
    scripts: Sequence[Path] = (),
    options: Mapping[str, str] = {},
    extra_args: Sequence[str] = (),
    wait_ready: bool = True,
    ready_timeout: float = START_DEADLINE_S,
    program: str = "mitmdump",
) -> Mitmdump:
    """Start mitmdump; unless `wait_ready=False`, wait until it listens and its scripts loaded.

    Args:
        mode: a `--mode` value, e.g. `regular` or `reverse:http://127.0.0.1:4242`.
        options: `--set name=value` pairs, passed in order after the scripts.
        wait_ready: False for tests that expect mitmdump to refuse to start.
        program: "mitmweb" to run that instead (same options; pass its web options in
            `extra_args`).

    Raises:
        MitmdumpError: it exited, did not listen within `ready_timeout`, or a script failed
        (the message carries the whole output).
    """
    args = [
        str(mitmdump_executable(program)),
        "--set",
        f"confdir={confdir}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--mode",
        mode,
    ]
    for script in scripts:
        args += ["-s", str(script)]
    for name, value in options.items():
        args += ["--set", f"{name}={value}"]
    args += list(extra_args)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Proxies from the environment must not reroute mitmdump's own upstream connections.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(name, None)
    # Its own log file next to its confdir (several mitmdumps may share one confdir).
    descriptor, log_path = tempfile.mkstemp(prefix=f"{program}-", suffix=".log", dir=confdir)
    os.close(descriptor)
    try:
        process = start_child(args, name=program, log_path=log_path, cwd=REPO_ROOT, env=env)
    except ChildStartError as error:
        raise MitmdumpError(str(error)) from None
    mitmdump = Mitmdump(args=args, process=process)
    if not wait_ready:
        return mitmdump
    try:
        # Told port 0, it listens where the kernel says; the "listening at" line names the proxy
        # port among its sockets (mitmweb has a second, its web UI) and comes after the scripts
        # loaded, so a failed script has said so by then.
        mitmdump.port = process.wait_until_listening(0, timeout=ready_timeout, port_in_log=MITM_LISTENING)
        if scripts and (failure := _SCRIPT_FAILED.search(mitmdump.output)):
            raise MitmdumpError(f"a mitmdump script failed to load ({failure.group(0)!r}){mitmdump._describe()}")
    except ChildStartError as error:
        mitmdump.stop()
        raise MitmdumpError(f"{str(error).split(';', 1)[0]}{mitmdump._describe()}") from None
    except BaseException:
        mitmdump.stop()
        raise
    return mitmdump


@contextmanager
def running_mitmdump(**kwargs: object) -> Iterator[Mitmdump]:
    """`start(**kwargs)`, and always stop it on exit; prints its output (pytest shows it on failure)."""
    mitmdump = start(**kwargs)  # type: ignore[arg-type]
    try:
        yield mitmdump
    finally:
        mitmdump.stop()
        print(f"--- mitmdump (pid {mitmdump.pid}, exit {mitmdump.process.returncode}) ---")
        print(" ".join(mitmdump.args))
        print(mitmdump.output)


@contextmanager
def running_finish_fix(*, confdir: Path, upstream_url: str, ledger: Path, options: Mapping[str, str] = {}) -> Iterator[Mitmdump]:
    """`running_mitmdump` with finish_fix in reverse mode in front of `upstream_url`, writing its
    ledger to `ledger`, with `options` on top of the addon's defaults."""
    with running_mitmdump(
        confdir=confdir,
        mode=f"reverse:{upstream_url}",
        scripts=[FINISH_FIX_SCRIPT],
        options={"finish_fix_ledger": str(ledger), **options},
    ) as mitmdump:
        yield mitmdump
