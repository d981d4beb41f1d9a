"""The Python driver host: one long-lived process that runs many streaming requests, in any dialect.

Importing LiteLLM and LangChain takes seconds, so the lab starts this once (`python -m
labs.clients.python_host`) and talks to it like to the Node host (labs/clients/node/host.mjs): one
JSON request per line on stdin, one JSON outcome per line on stdout, in completion order, matched by
"id"; the first line out is a hello with the versions. The clients run on asyncio because that is
what their async APIs are built on; the lab itself stays on trio in its own process.

The same module runs in every Python runtime: the lab's environment (`python`), and each
environment of its own (`--runtime NAME`, `.tools/clients/NAME`: labs.clients.OWN_ENVIRONMENTS),
started from that environment's interpreter with this checkout on its path. It imports only the
standard library and this checkout's standard-library modules before it imports a client library,
so it starts in an environment that holds nothing of the lab's; it runs only the (client, dialect)
pairs of its own runtime (`python_runtime_of`).

Request:  {"id", "client", "dialect"? ("chat" when absent), "base_url", "model", "messages",
           "max_tokens"?, "tools"?, "deadline_s", "api_key"?}; the driver is DRIVERS[(client, dialect)].
Outcome:  the fields of `run`'s record, the same in every dialect.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from finishline import Dialect
from labs.clients import OWN_ENVIRONMENTS
from labs.clients.python_drivers import DRIVERS, versions
from labs.clients.python_sink import Sink
from labs.dialects import LAB_DIALECTS


def _describe(error: BaseException) -> tuple[str, str]:
    message = str(error) or repr(error)
    # openai-python wraps transport errors (APIConnectionError "Connection error."): the cause is
    # what tells a reader whether the peer closed or reset.
    cause = error.__cause__ or error.__context__
    if cause is not None and (not str(cause) or str(cause) not in message):
        # Some transport errors have an empty message (httpx.ReadError on a reset): the class says it.
        message += f" (cause: {type(cause).__name__}: {cause})" if str(cause) else f" (cause: {type(cause).__name__})"
    return type(error).__name__, message


def python_runtime_of(client: str, dialect: Dialect) -> str:
    """The Python runtime whose host runs a driver: its environment of its own, or the lab's."""
    return OWN_ENVIRONMENTS.get((client, dialect), "python")


async def run(request: dict, runtime: str = "python") -> dict:
    """One request's outcome record, run by its driver; `runtime`: this host's (a (client, dialect)
    of another runtime is refused: its library is not in this environment)."""
    started = time.monotonic()
    record: dict = {
        "id": request.get("id"),
        "client": request.get("client"),
        "completed": False,
        "text": "",
        "reasoning": "",
        "finish_reason": None,
        "tool_calls": [],
        "error_class": None,
        "error_message": None,
        "ttft_s": None,
        "duration_s": None,
        "timed_out": False,
        "http_status": None,
        "connection": None,
    }

    def on_first() -> None:
        if record["ttft_s"] is None:
            record["ttft_s"] = time.monotonic() - started

    sink = Sink(on_first=on_first)
    deadline = asyncio.timeout(float(request["deadline_s"]))
    try:
        dialect = Dialect(request.get("dialect", Dialect.CHAT))
        client = request.get("client", "")
        driver = DRIVERS.get((client, dialect))
        if driver is None:
            raise LookupError(f"no Python driver named {client!r} in the {dialect} dialect")
        if python_runtime_of(client, dialect) != runtime:
            raise LookupError(
                f"{client} in the {dialect} dialect runs in the {python_runtime_of(client, dialect)} host, not the {runtime} one"
            )
        async with deadline:
            record["finish_reason"] = await driver(request, sink)
        record["completed"] = True
    except TimeoutError as error:
        if deadline.expired():
            record["timed_out"] = True
            record["error_class"], record["error_message"] = "TimeoutError", f"lab deadline of {request['deadline_s']}s passed"
        else:
            # A library's own timeout (a read timeout it raises as the builtin TimeoutError) is
            # what the client told its application: an error, not the lab's deadline.
            record["error_class"], record["error_message"] = _describe(error)
    except Exception as error:  # the library's own exception is the measurement
        record["error_class"], record["error_message"] = _describe(error)
    record["text"], record["reasoning"], record["tool_calls"] = sink.text, sink.reasoning, sink.tool_calls
    record["model"], record["usage"] = sink.model, sink.usage
    record["duration_s"] = time.monotonic() - started
    return record


async def main(runtime: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def write(obj: dict) -> None:
        PROTOCOL_OUT.write(json.dumps(obj) + "\n")
        PROTOCOL_OUT.flush()

    clients = {
        dialect.value: [name for name, d in DRIVERS if d is dialect and python_runtime_of(name, d) == runtime]
        for dialect in LAB_DIALECTS
    }
    write({"hello": {"runtime": runtime, "versions": versions(runtime), "clients": clients}})
    tasks: set[asyncio.Task] = set()

    async def serve(request: dict) -> None:
        write(await run(request, runtime))

    while line := await reader.readline():
        if not line.strip():
            continue
        task = asyncio.create_task(serve(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)


#: The modules each (client, dialect) needs; the host imports only those it is asked to run
#: (`python -m labs.clients.python_host [--runtime R] [--dialect D]... CLIENT...`, dialect `chat`
#: when none is given) and its runtime runs, before its hello, so no request is charged for an
#: import (LiteLLM's takes seconds, and anthropic's nearly as long on a loaded machine) and a run of
#: one light client starts fast. A driver not preloaded still works: it imports its library at its
#: first request.
PRELOAD: dict[tuple[str, Dialect], str] = {
    ("openai-python", Dialect.CHAT): "openai",
    ("openai-python-helper", Dialect.CHAT): "openai",
    ("langchain", Dialect.CHAT): "langchain_openai",
    ("litellm-sdk", Dialect.CHAT): "litellm",
    ("httpx-sse", Dialect.CHAT): "httpx_sse",
    ("anthropic-python", Dialect.MESSAGES): "anthropic",
    ("anthropic-python-helper", Dialect.MESSAGES): "anthropic",
    ("langchain", Dialect.MESSAGES): "langchain_anthropic",
    ("openai-python", Dialect.RESPONSES): "openai",
    ("openai-python-helper", Dialect.RESPONSES): "openai",
    ("langchain", Dialect.RESPONSES): "langchain_openai",
    ("google-genai", Dialect.GEMINI): "google.genai",
    ("langchain", Dialect.GEMINI): "langchain_google_genai",
}


def _arguments(argv: list[str]) -> tuple[str, list[str]]:
    """This host's runtime (`--runtime R`, `python` when absent) and the modules to import for this
    argv (`--dialect D` repeatable, then client names; no client names: every client of the
    dialects), those of the runtime's (client, dialect) pairs only."""
    runtime = "python"
    dialects: list[Dialect] = []
    clients: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--runtime":
            runtime = next(words)
        elif word == "--dialect":
            dialects.append(Dialect(next(words)))
        else:
            clients.append(word)
    dialects = dialects or [Dialect.CHAT]
    modules = dict.fromkeys(
        module
        for (client, dialect), module in PRELOAD.items()
        if dialect in dialects and (not clients or client in clients) and python_runtime_of(client, dialect) == runtime
    )
    return runtime, list(modules)


if __name__ == "__main__":
    import importlib

    # LiteLLM prints banners ("Give Feedback / Get Help") to stdout: keep the real stdout for the
    # protocol and send everything the libraries print to stderr.
    PROTOCOL_OUT = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr
    host_runtime, preloads = _arguments(sys.argv[1:])
    for module in preloads:
        importlib.import_module(module)
    asyncio.run(main(host_runtime))
