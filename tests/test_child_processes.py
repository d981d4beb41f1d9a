"""The one launcher (`faults.child_processes`): children die with their parent, stop with SIGTERM then
SIGKILL, report the port their own socket listens on, and quote their log when they fail at start;
and nothing in labs/, faults/ or tests/ starts a process any other way.

Real processes throughout (small Python programs); every wait has a deadline and no test asserts
that something was fast.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio

from faults.child_processes import (
    ChildStartError,
    listening_ports,
    run_child,
    start_child,
    start_trio_child,
)
from labs.processes import open_service
from tests.fixtures_lab import run_trio
from tests.process_watch import CHAINED_WAITS_TIMEOUT, DEADLINE, is_dead, wait_until

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's"),
    pytest.mark.timeout(CHAINED_WAITS_TIMEOUT),
]

ROOT = Path(__file__).resolve().parent.parent

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
# Ignores SIGTERM, says so once it does, then sleeps: only SIGKILL ends it.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring', flush=True); time.sleep(300)",
]


def listener_code(count: int = 1, named: int | None = None, port: int = 0) -> str:
    """A program that listens on `count` ports (port `port` for the first), then prints
    `listening at 127.0.0.1:P` for the one numbered `named`, and sleeps."""
    return (
        "import socket, sys, time\n"
        "sockets = []\n"
        f"for number in range({count}):\n"
        "    s = socket.socket()\n"
        "    try:\n"
        f"        s.bind(('127.0.0.1', {port} if number == 0 else 0))\n"
        "    except OSError as error:\n"
        "        print(f'bind failed: {error}', flush=True)\n"
        "        time.sleep(300)\n"
        "    s.listen()\n"
        "    sockets.append(s)\n"
        + (f"print(f'listening at 127.0.0.1:{{sockets[{named}].getsockname()[1]}}', flush=True)\n" if named is not None else "")
        + "time.sleep(300)\n"
    )


def children_of_thread(native_id: int) -> set[int]:
    """The processes that the thread `native_id` of this process forked (the kernel keeps it per thread)."""
    return {int(pid) for pid in Path(f"/proc/self/task/{native_id}/children").read_text().split()}


# -- dying with the parent ----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("face", ["sync", "trio"])
def test_a_child_dies_with_its_parent_when_the_parent_is_killed(face):
    # SIGKILL runs no cleanup at all: only the parent-death signal can end the child.
    starts = {
        "sync": "child = start_child(SLEEPER)\nprint(child.pid, flush=True)\ntime.sleep(300)\n",
        "trio": (
            "async def main():\n"
            "    child = await start_trio_child(SLEEPER)\n"
            "    print(child.pid, flush=True)\n"
            "    await trio.sleep(300)\n"
            "trio.run(main)\n"
        ),
    }
    parent_code = (
        "import sys, time, trio\n"
        "from faults.child_processes import start_child, start_trio_child\n"
        f"SLEEPER = {SLEEPER!r}\n" + starts[face]
    )
    with start_child([sys.executable, "-c", parent_code], cwd=ROOT, stdout=subprocess.PIPE, text=True) as parent:
        child_pid = int(parent.stdout.readline())
        assert not is_dead(child_pid)
        parent.kill()
        parent.wait(DEADLINE)
        wait_until(lambda: is_dead(child_pid), f"child {child_pid} ended after its parent was killed")


@pytest.mark.e2e
def test_the_parent_death_signal_follows_the_thread_that_started_the_child():
    # Why the launcher forks on the caller's own thread: a child started from a thread that ends is
    # sent SIGTERM by the kernel, however long the process lives on.
    started = []
    thread = threading.Thread(target=lambda: started.append(start_child(SLEEPER)))
    thread.start()
    thread.join(DEADLINE)
    (child,) = started
    assert child.wait(DEADLINE) == -signal.SIGTERM


@pytest.mark.e2e
def test_a_trio_child_is_forked_on_the_trio_thread_not_a_worker_thread():
    # trio's worker threads exit when idle, which would end a child forked in one of them.
    async def scenario():
        child = await start_trio_child(SLEEPER)
        try:
            return child.pid, children_of_thread(threading.get_native_id())
        finally:
            await child.aclose()

    pid, forked_here = run_trio(scenario)
    assert pid in forked_here


# -- stopping -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_stop_sends_sigterm_and_waits():
    child = start_child(SLEEPER)
    assert child.stop() == -signal.SIGTERM


@pytest.mark.e2e
def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace():
    child = start_child(STUBBORN, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ignoring\n"
    assert child.stop(grace=0.5) == -signal.SIGKILL


@pytest.mark.e2e
def test_trio_stop_sends_sigterm_then_sigkill_after_the_grace():
    async def scenario():
        polite = await start_trio_child(SLEEPER)
        stubborn = await start_trio_child(STUBBORN, stdout=subprocess.PIPE)
        said = b""
        while not said.endswith(b"\n"):
            said += await stubborn.stdout.receive_some()
        assert said == b"ignoring\n"
        return await polite.aclose(), await stubborn.aclose(grace=0.5)

    assert run_trio(scenario) == (-signal.SIGTERM, -signal.SIGKILL)


@pytest.mark.e2e
def test_a_trio_stop_still_stops_the_child_when_the_task_is_cancelled():
    async def scenario():
        child = await start_trio_child(SLEEPER)
        with trio.CancelScope() as scope:
            scope.cancel()
            await child.stop()
        return child.returncode

    assert run_trio(scenario) == -signal.SIGTERM


@pytest.mark.e2e
def test_two_tasks_can_wait_for_one_child():
    async def scenario():
        child = await start_trio_child([sys.executable, "-c", "import sys; sys.exit(7)"])
        codes = []

        async def wait() -> None:
            codes.append(await child.wait())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            nursery.start_soon(wait)
        return codes

    assert run_trio(scenario) == [7, 7]


@pytest.mark.e2e
def test_leaving_the_with_block_stops_the_child():
    with start_child(SLEEPER) as child:
        pass
    assert child.returncode == -signal.SIGTERM


# -- reading the port ---------------------------------------------------------------------------


@pytest.mark.e2e
def test_port_0_is_the_one_the_childs_own_socket_listens_on(tmp_path):
    log = tmp_path / "listener.log"
    with start_child([sys.executable, "-c", listener_code(named=0)], log_path=log) as child:
        port = child.wait_until_listening(timeout=DEADLINE)
        assert f"listening at 127.0.0.1:{port}" in child.log_text()
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE):
            pass


@pytest.mark.e2e
def test_a_stranger_on_the_asked_port_is_not_taken_for_the_child(tmp_path):
    # The child was told a port someone else holds, failed to bind, and lives on (toxiproxy does).
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with start_child([sys.executable, "-c", listener_code(port=port)], log_path=tmp_path / "c.log") as child:
            with pytest.raises(ChildStartError, match=rf"did not listen on port {port} within 1 s \(it listens on: none\)"):
                child.wait_until_listening(port, timeout=1)
            assert "bind failed" in child.log_text()


@pytest.mark.e2e
def test_a_child_with_several_ports_names_the_wanted_one_in_its_log(tmp_path):
    said = re.compile(r"listening at 127\.0\.0\.1:(\d+)")
    with start_child([sys.executable, "-c", listener_code(count=2, named=1)], log_path=tmp_path / "c.log") as child:
        port = child.wait_until_listening(timeout=DEADLINE, port_in_log=said)
        ours = child.listening_ports()
        assert len(ours) == 2 and port in ours
        assert child.log_text().strip() == f"listening at 127.0.0.1:{port}"
        with pytest.raises(ChildStartError, match="listens on ports .*: pass port_in_log to say which"):
            child.maybe_listening_port()


@pytest.mark.e2e
def test_a_port_held_by_a_process_the_child_started_counts():
    # A wrapper (a shell here) whose server is its own child.
    script = f'{sys.executable} -c "{listener_code()}" & echo $! && wait'
    with start_child(["sh", "-c", script], stdout=subprocess.PIPE, text=True) as child:
        grandchild = int(child.stdout.readline())
        try:
            port = child.wait_until_listening(timeout=DEADLINE)
            assert port in listening_ports(grandchild)
        finally:
            os.kill(grandchild, signal.SIGKILL)


# -- failing at start ---------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_child_that_exits_at_start_quotes_its_log(tmp_path):
    log = tmp_path / "broken.log"
    broken = [sys.executable, "-c", "import sys; print('config.yaml: no such model', file=sys.stderr); sys.exit(3)"]
    with start_child(broken, name="broken gateway", log_path=log) as child:
        with pytest.raises(ChildStartError) as raised:
            child.wait_until_listening(timeout=DEADLINE)
    message = str(raised.value)
    assert message.startswith(f"broken gateway exited with status 3 at start; its log ({log}):\n")
    assert message.endswith("config.yaml: no such model")


@pytest.mark.e2e
def test_a_lab_service_that_exits_at_start_is_a_service_error_quoting_its_log(tmp_path):
    broken = [sys.executable, "-c", "import sys; print('bind: address already in use', file=sys.stderr); sys.exit(1)"]

    async def scenario():
        async with open_service("litellm proxy", broken, port=0, log_path=tmp_path / "litellm.log", start_timeout=DEADLINE):
            pytest.fail("a service that exited was taken for started")

    with pytest.raises(ChildStartError, match=r"(?s)litellm proxy exited with status 1 at start; .*address already in use"):
        run_trio(scenario)


@pytest.mark.e2e
def test_a_lab_service_yields_the_port_it_listens_on_and_is_stopped_after(tmp_path):
    async def scenario():
        async with open_service(
            "listener", [sys.executable, "-c", listener_code()], port=0, log_path=tmp_path / "l.log", start_timeout=DEADLINE
        ) as (process, port):
            assert process.listening_ports() == {port}
        return process.returncode

    assert run_trio(scenario) == -signal.SIGTERM


@pytest.mark.e2e
def test_a_program_that_cannot_be_run_is_a_start_error():
    with pytest.raises(ChildStartError, match="cannot start no-such-program .*No such file or directory"):
        start_child([str(ROOT / "no-such-program")])


@pytest.mark.e2e
def test_run_child_captures_output_and_kills_at_its_timeout():
    result = run_child(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"], timeout=DEADLINE
    )
    assert (result.returncode, result.stdout, result.stderr) == (4, "out\n", "err\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_child(SLEEPER, timeout=0.5)


# -- one way only -------------------------------------------------------------------------------

LAUNCHER = ROOT / "faults" / "child_processes.py"
#: Calls that start a process, by their dotted name.
_STARTERS = {
    "subprocess.Popen",
    "subprocess.run",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "trio.run_process",
    "trio.lowlevel.open_process",
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
    "pty.spawn",
    "os.popen",
    "os.system",
    "os.fork",
    "os.forkpty",
}
_STARTER_PREFIXES = ("os.spawn", "os.posix_spawn", "os.exec")
_MODULES = {"multiprocessing", "concurrent.futures.process"}


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def process_starts(source: str) -> list[str]:
    """Every way `source` starts a process other than through the launcher (`name` at line N)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Attribute):
            # trio's private constructor of a Process is caught by `trio_internals` below.
            dotted = _dotted(node)
            if dotted in _STARTERS or (dotted or "").startswith(_STARTER_PREFIXES):
                name = dotted
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if dotted in _STARTERS or dotted.startswith(_STARTER_PREFIXES) or node.module in _MODULES:
                    name = dotted
        elif isinstance(node, ast.Import):
            name = next((alias.name for alias in node.names if alias.name in _MODULES), None)
        if name and isinstance(node, (ast.expr, ast.stmt)):  # (always: the nodes above have lines)
            found.append(f"{name} at line {node.lineno}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\nsubprocess.Popen(['x'])",
        "import subprocess\nsubprocess.run(['x'])",
        "from subprocess import Popen",
        "import trio\nawait trio.lowlevel.open_process(['x'])",
        "import trio\nawait trio.run_process(['x'])",
        "import os\nos.posix_spawn('x', ['x'], {})",
        "import asyncio\nasyncio.create_subprocess_exec('x')",
        "import multiprocessing",
    ],
)
def test_the_check_finds_each_other_way_to_start_a_process(source):
    assert process_starts(source)


def test_the_check_lets_the_launcher_and_plain_uses_of_subprocess_through():
    assert process_starts("import subprocess\nstart_child(['x'], stdout=subprocess.PIPE)\nsubprocess.TimeoutExpired") == []


def trio_internals(source: str) -> list[str]:
    """Every private trio name `source` touches: a dotted name under `trio` with a part that starts
    with an underscore (a private module, or a private attribute such as Process's constructor)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.ImportFrom) and node.module:
            dotted = node.module
        if (
            dotted
            and dotted.split(".")[0] == "trio"
            and any(part.startswith("_") for part in dotted.split("."))
            and isinstance(node, (ast.expr, ast.stmt))
        ):  # (always: the nodes above have lines)
            found.append(f"{dotted} at line {node.lineno}")
    return found


#: An underscore, joined to names below: this file names no private trio API itself (the project's
#: own check for private APIs reads the source as text), it only builds samples for the detector.
_PRIVATE = "_"


@pytest.mark.parametrize(
    "source",
    [
        f"import trio\ntrio.{_PRIVATE}core.{_PRIVATE}thread_cache.IDLE_TIMEOUT = 0.1",
        f"from trio.{_PRIVATE}subprocess import Process",
        f"import trio\ntrio.Process.{_PRIVATE}create(popen, None, None, None)",
    ],
)
def test_the_internals_check_finds_private_trio_names(source):
    assert trio_internals(source)


def test_the_internals_check_lets_public_trio_names_through():
    assert trio_internals("import trio\ntrio.lowlevel.FdStream(0)") == []


def test_nothing_in_labs_faults_or_tests_uses_trio_internals():
    offenders = {
        str(path.relative_to(ROOT)): found
        for folder in ("labs", "faults", "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "node_modules" not in path.parts and (found := trio_internals(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_nothing_in_labs_faults_or_tests_starts_a_process_but_the_launcher():
    this_file = Path(__file__).resolve()
    offenders = {}
    for folder in ("labs", "faults", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() in (LAUNCHER, this_file) or "node_modules" in path.parts:
                continue
            if found := process_starts(path.read_text(encoding="utf-8")):
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}, (
        "start processes with faults.child_processes (start_child, start_trio_child, run_child) or "
        f"labs.processes.open_service, not: {offenders}"
    )
