"""The one way to start a child process (toxiproxy, gateways, the hub, workers, driver hosts,
mitmdump, a CLI under test): start it, read its listening port, stop it, and never leave it behind.

Theory of operation. Every child gets the same policy, whoever starts it:

- **Start**: `subprocess.Popen` on the *calling* thread, stdin from /dev/null unless asked
  otherwise, output to a log file (appended; what this run wrote starts at `log_offset`) unless
  piped, and the parent-death signal (`faults.orphans.die_with_parent`): if this process dies
  without cleaning up (SIGKILL, a crash), the kernel sends the child SIGTERM. That signal fires when
  the *thread* that forked ends, so the fork happens right here: a sync caller (the fault CLI, a
  pytest fixture) forks on its main thread, which lives as long as the process; a trio caller forks
  on the trio thread (`start_trio_child` is called from a task), which lives as long as `trio.run`.
  trio's own `open_process` forks in a worker thread that exits after idling, which would fire the
  signal at a healthy child; that is why it is not used.
- **Port**: the port a child listens on is read from the kernel: the TCP sockets in LISTEN state
  that the child (or a process it started) holds, from Linux's /proc (`listening_ports`). A child is
  told port 0 where the program allows it, so no port is picked and released for a race, and a
  stranger already on the port is never taken for our child. Fallbacks, for the programs that need
  them: a child that listens on several ports (mitmweb: proxy and web UI) names the one wanted in
  its log (`port_in_log`, a regex whose first group is the port; the port must still be one of the
  child's own); a program that cannot be told port 0 gets `free_port()` and is started again when
  `bind_failed` says it lost the race.
- **Stop**: SIGTERM, then SIGKILL after a grace (`STOP_GRACE_S`), always waiting for the exit.
- **Failure at start**: a child that exits before it listens, or does not listen in time, raises
  `ChildStartError` whose message names it and quotes the end of its log.

Two faces of one child: `ChildProcess` (a `subprocess.Popen`, for sync callers; a `with` block stops
it) and `TrioChildProcess` (trio streams for its pipes, `await wait()` on a pidfd, `await stop()`).
`run_child` runs a short command to its end and captures its output (tests, version checks).
Linux only for the port and the parent-death signal (the lab needs Linux); elsewhere the port comes
from the log alone.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import trio

from faults.orphans import die_with_parent

__all__ = [
    "START_DEADLINE_S",
    "STOP_GRACE_S",
    "ChildProcess",
    "ChildStartError",
    "TrioChildProcess",
    "bind_failed",
    "free_port",
    "listening_ports",
    "read_port_from_log",
    "run_child",
    "start_child",
    "start_trio_child",
]

#: Seconds between SIGTERM and SIGKILL.
STOP_GRACE_S = 5.0
#: How long a child that is alive may take to be ready (to listen, to answer its health check, to
#: say hello): only a backstop for one that never will. A start waits on that condition and fails
#: at once when the child exits, so the room costs nothing when things go well; it is there for a
#: loaded machine. Under a parallel C++ build with memory and I/O pressure on 2 cores (issue 25),
#: the LiteLLM proxy had not listened after 120 s, the Python driver host had not said hello after
#: 60 s, and a mitmdump had not listened after 30 s, though each starts in seconds when idle.
START_DEADLINE_S = 300.0
#: How often a start is checked (exited? listening?).
_POLL_S = 0.05
#: Whether the kernel's view of sockets is there to read (Linux).
_HAVE_PROC = Path("/proc/self/net/tcp").exists()
_TCP_LISTEN = "0A"


class ChildStartError(RuntimeError):
    """A child process did not start: it exited, could not be run, or did not listen in time. The
    message names it and quotes the end of its log."""


class ChildProcess(subprocess.Popen):
    """A child started under the policy above; everything `subprocess.Popen` has, plus its log, its
    listening port, and `stop()`. Leaving a `with` block stops it (Popen's own would wait forever)."""

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        name: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        new_session: bool = False,
        text: bool = False,
    ) -> None:
        command = [os.fspath(part) for part in argv]
        self.name = name or Path(command[0]).name
        self.log_path = Path(log_path) if log_path is not None else None
        #: Where this run's output starts in the log (the file may hold earlier runs).
        self.log_offset = 0
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")
            self.log_offset = os.fstat(log.fileno()).st_size
        try:
            super().__init__(
                command,
                stdin=stdin,
                stdout=log if stdout is None and log is not None else stdout,
                stderr=log if stderr is None and log is not None else stderr,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=new_session,
                text=text,
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as error:
            raise ChildStartError(f"cannot start {self.name} ({command[0]}): {error.strerror or error}") from error
        finally:
            if log is not None:
                log.close()  # the child has its own copy

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self.stop()
        super().__exit__(exc_type, exc, traceback)

    def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit status once it has exited."""
        if self.poll() is None:
            self.terminate()
            try:
                return self.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.wait()

    # -- its log ------------------------------------------------------------------------------

    def log_text(self) -> str:
        """What this run wrote to its log so far ("" without a log)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def describe_log(self, lines: int = 15) -> str:
        """ "its log (PATH):" and its last lines, for an error message."""
        if self.log_path is None:
            return "it has no log file"
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"its log ({self.log_path}):\n{tail or '(empty)'}"

    # -- its port -----------------------------------------------------------------------------

    def listening_ports(self) -> frozenset[int] | None:
        """The TCP ports this child (or a process it started) listens on; None without /proc."""
        return listening_ports(self.pid)

    def maybe_listening_port(self, port: int = 0, *, port_in_log: re.Pattern[str] | None = None) -> int | None:
        """The child's listening port if it listens yet, else None (one check; see the module doc).

        Args:
            port: the port the program was told; 0 if it picks one.
            port_in_log: for a child with several ports, the log line naming the one wanted.

        Raises:
            ChildStartError: it exited, or it listens on several ports and `port_in_log` is missing.
        """
        code = self.poll()
        if code is not None:
            raise ChildStartError(f"{self.name} exited with status {code} at start; {self.describe_log()}")
        named = read_port_from_log(self.log_path, self.log_offset, port_in_log) if port_in_log and self.log_path else 0
        ours = self.listening_ports()
        if ours is None:  # no /proc: the program's own word is all there is
            return port or named or None
        if port:
            return port if port in ours else None
        if port_in_log is not None:
            return named if named in ours else None
        if len(ours) > 1:
            raise ChildStartError(
                f"{self.name} listens on ports {', '.join(map(str, sorted(ours)))}: pass port_in_log to say which is wanted"
            )
        return next(iter(ours), None)

    def wait_until_listening(self, port: int = 0, *, timeout: float, port_in_log: re.Pattern[str] | None = None) -> int:
        """`maybe_listening_port` until it answers; returns the port.

        Raises:
            ChildStartError: it exited, or did not listen within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while (found := self.maybe_listening_port(port, port_in_log=port_in_log)) is None:
            if time.monotonic() > deadline:
                raise ChildStartError(self._not_listening(port, port_in_log, timeout))
            time.sleep(_POLL_S)
        return found

    def _not_listening(self, port: int, port_in_log: re.Pattern[str] | None, timeout: float) -> str:
        wanted = f"port {port}" if port else f"the port its log names ({port_in_log.pattern!r})" if port_in_log else "a port"
        ours = self.listening_ports()
        held = ", ".join(map(str, sorted(ours))) if ours else "none"
        return f"{self.name} did not listen on {wanted} within {timeout} s (it listens on: {held}); {self.describe_log()}"


def start_child(argv: Sequence[str | os.PathLike[str]], **options: Any) -> ChildProcess:
    """Start a child on the calling thread under the policy above (options: those of `ChildProcess`).

    Raises:
        ChildStartError: the program cannot be run (not found, not executable).
    """
    return ChildProcess(argv, **options)


class TrioChildProcess:
    """The trio face of a `ChildProcess`: pipes as trio streams, and waiting that never blocks trio.

    Attributes:
        process: the child's `ChildProcess` (its log, its port).
        stdin, stdout, stderr: `trio.lowlevel.FdStream` for each pipe asked for, else None.
    """

    def __init__(self, process: ChildProcess) -> None:
        self.process = process
        self.stdin = _trio_stream(process, "stdin")
        self.stdout = _trio_stream(process, "stdout")
        self.stderr = _trio_stream(process, "stderr")

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path

    def poll(self) -> int | None:
        return self.process.poll()

    def send_signal(self, number: int) -> None:
        self.process.send_signal(number)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.process.kill()

    async def wait(self) -> int:
        """Wait until the child exits (a pidfd, so no thread) and return its exit status."""
        if self.process.poll() is not None:
            await trio.lowlevel.checkpoint()
            return self.process.returncode
        if not hasattr(os, "pidfd_open"):
            return await trio.to_thread.run_sync(self.process.wait, abandon_on_cancel=True)
        # A pidfd per call, so that two tasks can wait at once (trio allows one waiter per fd). The
        # pid cannot be reused before this: only we reap the child, and it is not reaped yet.
        try:
            pidfd = os.pidfd_open(self.process.pid)
        except ProcessLookupError:  # reaped by a `poll()` in another thread since the check above
            return self.process.wait()
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        return self.process.wait()

    async def stop(self, grace: float = STOP_GRACE_S) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; shielded, so a cancelled lab still stops it."""
        with trio.CancelScope(shield=True):
            if self.process.poll() is None:
                self.terminate()
                with trio.move_on_after(grace):
                    return await self.wait()
                self.kill()
            status = await self.wait()
        return status  # (after the shielded scope, which never swallows anything: it is never cancelled)

    async def aclose(self, grace: float = STOP_GRACE_S) -> int:
        """`stop()`, then close the pipes; returns the exit status."""
        code = await self.stop(grace)
        with trio.CancelScope(shield=True):
            for stream in (self.stdin, self.stdout, self.stderr):
                if stream is not None:
                    await stream.aclose()
        return code

    def listening_ports(self) -> frozenset[int] | None:
        return self.process.listening_ports()

    async def wait_until_listening(self, port: int = 0, *, timeout: float, port_in_log: re.Pattern[str] | None = None) -> int:
        """`ChildProcess.wait_until_listening`, sleeping in trio between checks."""
        with trio.move_on_after(timeout):
            while (found := self.process.maybe_listening_port(port, port_in_log=port_in_log)) is None:
                await trio.sleep(_POLL_S)
            return found
        raise ChildStartError(self.process._not_listening(port, port_in_log, timeout))


async def start_trio_child(argv: Sequence[str | os.PathLike[str]], **options: Any) -> TrioChildProcess:
    """`start_child` for trio code: forks on the trio thread (see the module doc), pipes as trio streams."""
    process = start_child(argv, **options)
    await trio.lowlevel.checkpoint()
    return TrioChildProcess(process)


def _trio_stream(process: ChildProcess, attribute: str) -> trio.lowlevel.FdStream | None:
    pipe = getattr(process, attribute)
    if pipe is None:
        return None
    stream = trio.lowlevel.FdStream(os.dup(pipe.fileno()))
    pipe.close()
    setattr(process, attribute, None)  # only the trio stream reads or writes it from now on
    return stream


def run_child(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    input: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a short command to its end under the same policy; its output captured as text.

    Raises:
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is killed first).
    """
    with start_child(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    ) as child:
        try:
            stdout, stderr = child.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


# -- reading ports ------------------------------------------------------------------------------


def listening_ports(pid: int) -> frozenset[int] | None:
    """The TCP ports that process `pid` or its descendants listen on, from Linux's /proc.

    Only the processes' own sockets count (matched by inode in the kernel's socket table), so a
    stranger listening on the same port is never taken for ours. Empty if the process is gone;
    None where there is no /proc.
    """
    if not _HAVE_PROC:
        return None
    inodes: set[str] = set()
    for member in _process_tree(pid):
        inodes |= _socket_inodes(member)
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone (the caller sees it exit), or no IPv6
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            fields = line.split()
            if fields[3] == _TCP_LISTEN and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return frozenset(ports)


def _process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (a wrapper script's server counts as the child's)."""
    tree, index = [pid], 0
    while index < len(tree):
        for task in Path(f"/proc/{tree[index]}/task").glob("*"):
            try:
                tree += [int(child) for child in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
        index += 1
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return inodes
    for fd in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed since the listing
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def read_port_from_log(path: str | os.PathLike[str] | None, offset: int, pattern: re.Pattern[str] | None) -> int:
    """The first group of `pattern` in the log after `offset`, as a port; 0 if not (yet) there."""
    if path is None or pattern is None:
        return 0
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            match = pattern.search(log.read().decode("utf-8", "replace"))
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, for a program that cannot be told port 0; start it again
    on another when `bind_failed` says the port was taken meanwhile.

    Picked below the kernel's ephemeral range where it can: a port the kernel hands out for port 0
    is also what it hands to the next outgoing connection, so between this probe and the program's
    bind any client on the machine could take it (seen in CI: `Address already in use`).
    """
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    # Linux: "32768\t60999"; elsewhere, or unreadable, IANA's dynamic range starts at 49152.
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def bind_failed(error: ChildStartError) -> bool:
    """Whether a start failed because its port was taken (after `free_port`'s race)."""
    return bool(re.search(r"address already in use|errno 98|could not bind", str(error), re.I))
