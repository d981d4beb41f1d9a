"""Every Messages and Responses client driver, run through its driver host against the worker.

What each library does, measured by running it (the versions in tests/test_clients_pinned.py) and
read in its source; the rows of ../shared/notes/dialects.md sections 1 and 2 they check:

- healthy (`tokens=5`): every client returns the whole text and its own word for a natural end:
  `end_turn` (Messages SDKs, LangChain's `response_metadata`), `completed` (Responses SDKs,
  LangChain), the AI SDK's unified `stop`, pi-ai's `stop`.
- terminator lost (`done=0`). Messages: the `message_delta` with `end_turn` arrives, `message_stop`
  does not. anthropic-python (raw and `get_final_message()`), LangChain and @anthropic-ai/sdk raw
  are silent and say `end_turn`; `MessageStream.finalMessage()` rejects (a message is recorded only
  at `message_stop`, lib/MessageStream.mjs); @ai-sdk/anthropic says `interrupted` (its finish part
  is sent at `message_stop`; without one its flush sends `interrupted`); pi-ai errors "Anthropic
  stream ended before message_stop". Responses: no terminal event. openai-python raw, LangChain and
  openai-node raw are silent (no reason); `get_final_response()` raises RuntimeError;
  `ResponseStream.finalResponse()` resolves with the snapshot, status `in_progress`; @ai-sdk/openai
  says `interrupted`; pi-ai errors "OpenAI Responses stream ended before a terminal response event".
- Messages, no reason and no terminator (`finish=omitted; done=0`, the note's column A): as above,
  but the silent ones surface no reason at all.
- Messages, `stop_reason: null` then `message_stop` (`null_reason=1`, vLLM's abort, column B): every
  SDK is silent with no reason (`finalMessage()` resolves too), the AI SDK says `other`, pi-ai errors
  "Anthropic stream ended without a stop reason".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from finishline import Dialect
from labs.clients import LAB_API_KEY, LIBRARY_CLIENTS_BY_DIALECT
from labs.clients.hosts import open_driver_hosts
from labs.worker.server import open_worker
from tests.fixtures_lab import run_trio

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NEW_DIALECTS = (Dialect.MESSAGES, Dialect.RESPONSES)
#: The worker's answer for `tokens=5` (labs.worker.answer), in every dialect.
TEXT = "The quick brown fox jumps"

#: scenario: (the worker settings, the dialects it runs in).
SCENARIOS: dict[str, tuple[str, tuple[Dialect, ...]]] = {
    "healthy": ("tokens=5", NEW_DIALECTS),
    "terminator-lost": ("tokens=5;done=0", NEW_DIALECTS),
    "reason-and-terminator-lost": ("tokens=5;finish=omitted;done=0", (Dialect.MESSAGES,)),
    "null-reason-then-stop": ("tokens=5;null_reason=1", (Dialect.MESSAGES,)),
}

# (completed, finish_reason when completed or error class when not, a fragment of the error message)
OK_END_TURN = (True, "end_turn", None)
OK_NO_REASON = (True, None, None)
NODE_HELPER_NO_MESSAGE = (False, "AnthropicError", "stream ended without producing a Message with role=assistant")
PI_BEFORE_MESSAGE_STOP = (False, "PiStreamError(error)", "Anthropic stream ended before message_stop")

EXPECTED: dict[tuple[str, Dialect], dict[str, tuple[bool, str | None, str | None]]] = {
    ("healthy", Dialect.MESSAGES): {
        "anthropic-python": OK_END_TURN,
        "anthropic-python-helper": OK_END_TURN,
        "langchain": OK_END_TURN,
        "anthropic-node": OK_END_TURN,
        "anthropic-node-helper": OK_END_TURN,
        "ai-sdk-anthropic": (True, "stop", None),
        "pi-ai": (True, "stop", None),
    },
    ("healthy", Dialect.RESPONSES): {
        "openai-python": (True, "completed", None),
        "openai-python-helper": (True, "completed", None),
        "langchain": (True, "completed", None),
        "openai-node": (True, "completed", None),
        "openai-node-helper": (True, "completed", None),
        "ai-sdk-openai": (True, "stop", None),
        "pi-ai": (True, "stop", None),
    },
    ("terminator-lost", Dialect.MESSAGES): {
        "anthropic-python": OK_END_TURN,
        "anthropic-python-helper": OK_END_TURN,
        "langchain": OK_END_TURN,
        "anthropic-node": OK_END_TURN,
        "anthropic-node-helper": NODE_HELPER_NO_MESSAGE,
        "ai-sdk-anthropic": (True, "interrupted", None),
        "pi-ai": PI_BEFORE_MESSAGE_STOP,
    },
    ("terminator-lost", Dialect.RESPONSES): {
        "openai-python": OK_NO_REASON,
        "openai-python-helper": (False, "RuntimeError", "Didn't receive a `response.completed` event."),
        "langchain": OK_NO_REASON,
        "openai-node": OK_NO_REASON,
        "openai-node-helper": (True, "in_progress", None),
        "ai-sdk-openai": (True, "interrupted", None),
        "pi-ai": (False, "PiStreamError(error)", "OpenAI Responses stream ended before a terminal response event"),
    },
    ("reason-and-terminator-lost", Dialect.MESSAGES): {
        "anthropic-python": OK_NO_REASON,
        "anthropic-python-helper": OK_NO_REASON,
        "langchain": OK_NO_REASON,
        "anthropic-node": OK_NO_REASON,
        "anthropic-node-helper": NODE_HELPER_NO_MESSAGE,
        "ai-sdk-anthropic": (True, "interrupted", None),
        "pi-ai": PI_BEFORE_MESSAGE_STOP,
    },
    ("null-reason-then-stop", Dialect.MESSAGES): {
        "anthropic-python": OK_NO_REASON,
        "anthropic-python-helper": OK_NO_REASON,
        "langchain": OK_NO_REASON,
        "anthropic-node": OK_NO_REASON,
        "anthropic-node-helper": OK_NO_REASON,
        "ai-sdk-anthropic": (True, "other", None),
        "pi-ai": (False, "PiStreamError(error)", "Anthropic stream ended without a stop reason"),
    },
}

CELLS = [
    (scenario, dialect, client)
    for scenario, (_, dialects) in SCENARIOS.items()
    for dialect in dialects
    for client in LIBRARY_CLIENTS_BY_DIALECT[dialect]
]


def test_every_new_client_has_an_expectation_in_every_scenario():
    # The table above is the whole matrix: a client added to a dialect must be measured here too.
    for scenario, (_, dialects) in SCENARIOS.items():
        for dialect in dialects:
            assert set(EXPECTED[(scenario, dialect)]) == set(LIBRARY_CLIENTS_BY_DIALECT[dialect])


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[str, Dialect, str], dict[str, Any]]:
    """Every cell's driver report, from one worker and one host per runtime, cells run concurrently."""
    log_dir: Path = tmp_path_factory.mktemp("clients-dialects")
    clients = tuple(dict.fromkeys(client for _, _, client in CELLS))

    async def run_all() -> dict[tuple[str, Dialect, str], dict[str, Any]]:
        results: dict[tuple[str, Dialect, str], dict[str, Any]] = {}
        async with open_worker() as worker, open_driver_hosts(clients, log_dir, NEW_DIALECTS) as hosts:

            async def one(number: int, cell: tuple[str, Dialect, str]) -> None:
                scenario, dialect, client = cell
                cell_id = f"c{number:04d}"
                results[cell] = await hosts[client].run(
                    {
                        "id": cell_id,
                        "client": client,
                        "dialect": dialect.value,
                        "base_url": f"http://127.0.0.1:{worker.port}/v1",
                        # The cell id is a name item the worker ignores (labs.worker.settings).
                        "model": f"{cell_id};{SCENARIOS[scenario][0]}",
                        "messages": [{"role": "user", "content": "Say the sentence about the fox."}],
                        "deadline_s": 30.0,
                        "api_key": LAB_API_KEY,
                    }
                )

            async with trio.open_nursery() as nursery:
                for number, cell in enumerate(CELLS):
                    nursery.start_soon(one, number, cell)
        return results

    return run_trio(run_all, deadline=150)


@pytest.mark.parametrize(("scenario", "dialect", "client"), CELLS, ids=[f"{s}-{d}-{c}" for s, d, c in CELLS])
def test_what_each_client_makes_of_the_stream(reports, scenario, dialect, client):
    report = reports[(scenario, dialect, client)]
    completed, reason_or_class, message = EXPECTED[(scenario, dialect)][client]
    assert report["timed_out"] is False, report
    assert report["completed"] is completed, report
    if completed:
        assert report["finish_reason"] == reason_or_class, report
    else:
        assert report["error_class"] == reason_or_class, report
        assert message in report["error_message"], report
    # Whatever the client concluded, the whole answer reached the application.
    assert report["text"] == TEXT, report
