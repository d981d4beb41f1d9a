"""How the lab's commands and helper processes end: stopped by a signal, killed, crashed, or refused.

Real processes throughout: the lab's CLI, `make ui`'s command, the worker's CLI, the Python driver
host. Every test has a deadline; none asserts that something was fast.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from faults.child_processes import ChildProcess, start_child
from labs.clients.hosts import DRIVER_HOST_CRASHED, open_driver_hosts
from labs.worker.server import open_worker
from tests.fixtures_lab import run_trio
from tests.process_watch import CHAINED_WAITS_TIMEOUT, DEADLINE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(CHAINED_WAITS_TIMEOUT)]

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(child) for child in (task / "children").read_text().split()}
        except (FileNotFoundError, ValueError):
            continue
    return found


def _lab(*arguments: str, cwd: Path) -> ChildProcess:
    return start_child(
        [sys.executable, "-m", *arguments],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        new_session=True,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_helper_process_dies_with_the_lab_even_when_the_lab_is_killed(tmp_path):
    # The lab's side of it: a parent that starts a child with faults.child_processes.start_trio_child, then is
    # SIGKILLed (no cleanup runs): the kernel ends the child instead of leaving an orphan.
    parent_code = (
        "import sys, trio\n"
        "from faults.child_processes import start_trio_child\n"
        "async def main():\n"
        "    child = await start_trio_child([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "    print(child.pid, flush=True)\n"
        "    await trio.sleep(300)\n"
        "trio.run(main)\n"
    )
    parent = start_child([sys.executable, "-c", parent_code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
        parent.kill()
        parent.wait(timeout=DEADLINE)
        wait_until(lambda: not _alive(child_pid), f"child {child_pid} ended after its parent was killed")
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_lab_and_every_helper_with_one_line(tmp_path, stop_signal) -> None:
    # A stalled scenario keeps the cell in flight; finish_fix (mitmdump) and the driver host run.
    lab = _lab(
        "labs",
        "--scenario",
        "stall-after-tokens",
        "--gateway",
        "finish_fix",
        "--client",
        "httpx-sse",
        "--results",
        str(tmp_path),
        cwd=tmp_path,
    )
    try:
        helpers: set[int] = set()

        def helpers_started() -> bool:
            helpers.update(_children(lab.pid))
            names = {Path(f"/proc/{pid}/cmdline").read_text(errors="replace") for pid in helpers if _alive(pid)}
            return any("mitmdump" in name for name in names) and any("python_host" in name for name in names)

        wait_until(helpers_started, "the lab started mitmdump and the Python driver host")
        lab.send_signal(stop_signal)
        _, stderr = lab.communicate(timeout=DEADLINE)
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
    assert lab.returncode == 128 + stop_signal
    assert stderr.strip().splitlines()[-1] == f"stopped ({stop_signal.name})"
    assert "Traceback" not in stderr
    wait_until(lambda: not any(_alive(pid) for pid in helpers), f"helpers {helpers} ended")


def test_make_ui_stops_on_ctrl_c_and_keeps_its_ledger_folder(tmp_path):
    ui = _lab("labs.ui", cwd=tmp_path)
    try:
        lines = []
        for line in ui.stdout:
            lines.append(line)
            if "books (ledger):" in line:
                break
        ledger = Path(lines[-1].split("books (ledger):", 1)[1].strip())
        helpers = _children(ui.pid)
        ui.send_signal(signal.SIGINT)
        _, stderr = ui.communicate(timeout=DEADLINE)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
    assert ui.returncode == 0
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "stopped (SIGINT)"
    # Under lab-results/ui-<time>/, not a temporary folder deleted at exit.
    assert ledger.parent.parent == (tmp_path / "lab-results").resolve()
    assert ledger.parent.name.startswith("ui-") and ledger.parent.is_dir()
    wait_until(lambda: not any(_alive(pid) for pid in helpers), f"helpers {helpers} ended")


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text('title = "bad"\n' + text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[worker]\ntokens = 12\n[fault]\nkind = "cut_after_tokens"\nn = 500\n', "error: bad: fault cut_after_tokens: "),
        ('[fault]\nkind = "meteor"\n', "error: bad: unknown fault 'meteor'; known: "),
        ('deadline_s = "abc"\n', "`deadline_s` must be a number of seconds above 0, not 'abc'"),
        ('clients = "pi-ai"\n', "`clients` must be a list of names"),
        ('gateways = ["nginx"]\n', "`gateways`: unknown 'nginx'; valid: direct, "),
    ],
    ids=["cut-beyond-the-stream", "unknown-fault", "deadline-not-a-number", "clients-a-string", "unknown-gateway"],
)
def test_a_bad_scenario_is_one_error_line_and_status_2(tmp_path, text, message):
    lab = _lab("labs", "--scenario", str(_scenario(tmp_path, text)), "--results", str(tmp_path), cwd=tmp_path)
    stdout, stderr = lab.communicate(timeout=DEADLINE)
    assert lab.returncode == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error: ") and message in stderr


def _busy_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_a_busy_tunnel_port_is_one_error_line_and_status_2(tmp_path):
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        lab = _lab(
            "labs",
            "--scenario",
            "healthy",
            "--gateway",
            "direct",
            "--client",
            "httpx-sse",
            "--tunnel-port",
            str(port),
            "--results",
            str(tmp_path),
            cwd=tmp_path,
        )
        _, stderr = lab.communicate(timeout=DEADLINE)
    assert lab.returncode == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error: ") and str(port) in stderr


def test_the_worker_on_a_busy_port_is_one_error_line(tmp_path):
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        worker = _lab("labs.worker", "--port", str(port), cwd=tmp_path)
        _, stderr = worker.communicate(timeout=DEADLINE)
    assert worker.returncode == 2
    assert stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use; pick another --port"


def test_a_crashed_driver_host_fails_its_waiting_cells_at_once_with_an_error(tmp_path):
    # The request would take 60 s (prefill) and its deadline is 60 s: only the crash can end it
    # within the test's deadline, and it must end as an error naming the crash, not a hang.
    async def scenario():
        async with open_worker() as worker, open_driver_hosts(("httpx-sse",), tmp_path) as hosts:
            host = hosts["httpx-sse"]
            request = {
                "id": "c0001",
                "client": "httpx-sse",
                "base_url": f"http://127.0.0.1:{worker.port}/v1",
                "model": "c0001;prefill_delay=60",
                "deadline_s": 60.0,
                "api_key": "sk-test",
                "messages": [{"role": "user", "content": "hi"}],
            }
            records = []

            async def one(number: int) -> None:
                records.append(await host.run({**request, "id": f"c000{number}"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, 1)
                nursery.start_soon(one, 2)
                while len(host._waiting) < 2:  # both requests sent to the host
                    await trio.sleep(0.05)
                host.process.kill()
            later = await host.run({**request, "id": "c0003"})
            return records, later

    records, later = run_trio(scenario, deadline=45)
    for record in (*records, later):
        assert record["error_class"] == DRIVER_HOST_CRASHED
        assert record["timed_out"] is False and record["completed"] is False
        assert "the python driver host ended (exit status -9)" in record["error_message"]
    assert len(records) == 2
