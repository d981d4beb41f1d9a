"""What the three coding agents of the OpenAI and Anthropic dialects do, run headless by the lab,
through `direct` and `finish_fix`, pinned (gemini-cli, in Gemini: tests/test_lab_agents_gemini_e2e.py).

One real lab run (the module's fixture): Pi's coding agent in its three APIs, Claude Code in
Messages, Codex in Responses, each cell one `-p`/`exec` prompt in a loopback-only network
namespace, in `healthy`, `reason-omitted` and `cut-after-tokens-hub-close` (5 tokens, then the hub
ends the response cleanly), in every dialect each speaks. Each expectation was measured here and
read in the agent's published code (versions in `PINNED_VERSIONS`; an upgrade fails that test
first: re-read the code named below, then the pins):

- Pi's coding agent 1.6.0 retries a failed turn: `dist/core/agent-session.js` retries an assistant
  error whose message matches `isRetryableAssistantError` (pi-ai `dist/utils/retry.js`: "ended
  without", "stream ended before message_stop", "stream ended before a terminal response event",
  "stream was interrupted", ...) up to `retry.maxRetries` = 3 times (`dist/core/settings-defaults.js`),
  2, 4 and 8 s apart: 4 requests, then its last error on stderr and exit 1
  (`dist/modes/print-mode.js`). It retries the cut turn in every dialect, through both gateways.
  Without finish_fix its words are pi-ai's own (`Stream ended without finish_reason`, `Anthropic
  stream ended before message_stop` / `without a stop reason`, `OpenAI Responses stream ended
  before a terminal response event`); through finish_fix, finish_fix's "stream was interrupted:
  ..." (in Messages the raw JSON of the `error` event: pi-ai throws `new Error(sse.data)`). The
  omitted reason is repaired (`ok`) in Chat and Messages; in Responses the worker ends that stream
  with `data: [DONE]` in place of a terminal event, a cut: finish_fix sends its `error` and
  `response.failed` before the `[DONE]` (openai-node's stream, pi-ai's Responses client, reads
  nothing after it, rule R3), so Pi says finish_fix's words and retries (an `error`, 4 requests).
- Claude Code 2.1.332 (strings of its binary): a stream that ends cleanly without `message_stop`
  after some text is `truncated`: retried streaming once, then asked again without streaming
  (`F6("truncations",1,...)`, then `retryWithoutStreaming`): 3 requests, and the non-streaming
  answer is whole: exit 0, the whole answer, `ok`. finish_fix's `api_error` event is a
  `serverError`: straight to the request without streaming, 2 requests, `ok`. A stream with
  `message_stop` but no `message_delta` (reason omitted) it takes as it is: the whole text, `ok`.
- Codex 0.171.0 retries every stream that ends without `response.completed` as "stream
  disconnected", `stream_max_retries` = 5 times (`codex-rs/model-provider-info`): 6 requests, then
  `ERROR: stream disconnected before completion: ...` on stderr and exit 1; through finish_fix the
  reason is `response.failed`'s message ("stream was interrupted: ..."), still retried 5 times.

Through finish_fix no agent is `silent-truncation` or `hang` for the cut; none is anywhere here.
Every cell ran in a network namespace whose only interface is `lo`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from faults.child_processes import start_child
from finishline import Dialect
from labs.clients import AGENT_CLIENTS_BY_DIALECT
from labs.clients.agent_host import agent_refusal
from labs.scenario import SCENARIO_DIR, load_scenario
from labs.worker.wire import response_plan
from tests.fixtures_chaos import run_lab_over
from tests.fixtures_lab import body_bytes_through_token
from tests.process_watch import DEADLINE, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    # The lab runs each agent in a network namespace of its own making, which needs root (as here
    # and in CI); elsewhere it refuses the agents in one line, which the last test shows as root.
    pytest.mark.skipif(os.geteuid() != 0, reason="the coding agents need root: each runs in a network namespace of its own"),
]

SCENARIOS = ("healthy", "reason-omitted", "cut-after-tokens-hub-close")
GATEWAYS = ("direct", "finish_fix")
#: The run takes about 2 minutes here (Pi's retries, 16 s a failing cell, set each row's pace).
RUN_DEADLINE_S = 480

PINNED_VERSIONS = {"pi-coding-agent": "1.6.0", "claude-code": "2.1.332", "codex": "0.171.0", "node": "22.23.5"}
#: The dialects of this run, and its agents (each of these speaks at least one of them).
DIALECTS = (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)
AGENTS = ("pi-coding-agent", "claude-code", "codex")


@pytest.fixture(scope="module")
def agents_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_lab_over(
        SCENARIOS,
        Path(tmp_path_factory.mktemp("lab-results")),
        clients=AGENTS,
        gateways=GATEWAYS,
        dialects=DIALECTS,
        deadline=RUN_DEADLINE_S,
        each={"gateways": GATEWAYS},
    )


def _cells(run: dict[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {(c["scenario"], c["dialect"], c["gateway"], c["client"]): c for c in run["cells"]}


OK = ("ok", 0, 1, None)
CODEX_DISCONNECTED = "ERROR: stream disconnected before completion: stream closed before response.completed"
CODEX_INTERRUPTED = "ERROR: stream disconnected before completion: stream was interrupted: the upstream ended the response"
FINISH_FIX_WORDS = "stream was interrupted: the upstream ended the response after"

# (scenario, dialect, gateway, client): (outcome, exit status, requests the worker saw, the
# start of the agent's last error line, None when it exited 0).
EXPECTED: dict[tuple[str, str, str, str], tuple[str, int, int, str | None]] = {
    **{("healthy", d.value, g, c): OK for d in DIALECTS for g in GATEWAYS for c in AGENT_CLIENTS_BY_DIALECT[d]},
    ("reason-omitted", "chat", "direct", "pi-coding-agent"): ("error", 1, 4, "Stream ended without finish_reason"),
    ("reason-omitted", "chat", "finish_fix", "pi-coding-agent"): OK,
    ("reason-omitted", "messages", "direct", "pi-coding-agent"): ("error", 1, 4, "Anthropic stream ended without a stop reason"),
    ("reason-omitted", "messages", "direct", "claude-code"): OK,
    ("reason-omitted", "messages", "finish_fix", "pi-coding-agent"): OK,
    ("reason-omitted", "messages", "finish_fix", "claude-code"): OK,
    ("reason-omitted", "responses", "direct", "pi-coding-agent"): (
        "error",
        1,
        4,
        "OpenAI Responses stream ended before a terminal response event",
    ),
    ("reason-omitted", "responses", "direct", "codex"): ("error", 1, 6, CODEX_DISCONNECTED),
    ("reason-omitted", "responses", "finish_fix", "pi-coding-agent"): ("error", 1, 4, FINISH_FIX_WORDS),
    ("reason-omitted", "responses", "finish_fix", "codex"): ("error", 1, 6, CODEX_INTERRUPTED),
    ("cut-after-tokens-hub-close", "chat", "direct", "pi-coding-agent"): ("error", 1, 4, "Stream ended without finish_reason"),
    ("cut-after-tokens-hub-close", "chat", "finish_fix", "pi-coding-agent"): ("error", 1, 4, FINISH_FIX_WORDS),
    ("cut-after-tokens-hub-close", "messages", "direct", "pi-coding-agent"): (
        "error",
        1,
        4,
        "Anthropic stream ended before message_stop",
    ),
    ("cut-after-tokens-hub-close", "messages", "direct", "claude-code"): ("ok", 0, 3, None),
    ("cut-after-tokens-hub-close", "messages", "finish_fix", "pi-coding-agent"): (
        "error",
        1,
        4,
        '{"type":"error","error":{"type":"api_error","message":"' + FINISH_FIX_WORDS,
    ),
    ("cut-after-tokens-hub-close", "messages", "finish_fix", "claude-code"): ("ok", 0, 2, None),
    ("cut-after-tokens-hub-close", "responses", "direct", "pi-coding-agent"): (
        "error",
        1,
        4,
        "OpenAI Responses stream ended before a terminal response event",
    ),
    ("cut-after-tokens-hub-close", "responses", "direct", "codex"): ("error", 1, 6, CODEX_DISCONNECTED),
    ("cut-after-tokens-hub-close", "responses", "finish_fix", "pi-coding-agent"): ("error", 1, 4, FINISH_FIX_WORDS),
    ("cut-after-tokens-hub-close", "responses", "finish_fix", "codex"): ("error", 1, 6, CODEX_INTERRUPTED),
}


def test_the_run_reports_the_pinned_agent_versions(agents_run):
    versions = agents_run["versions"]["agents"]
    assert {name: versions[name] for name in PINNED_VERSIONS} == PINNED_VERSIONS


def test_every_agent_cell_ran_with_no_network_interface_but_lo(agents_run):
    assert len(agents_run["cells"]) == len(EXPECTED)
    assert {tuple(c["report"]["interfaces"]) for c in agents_run["cells"]} == {("lo",)}


@pytest.mark.parametrize("key", list(EXPECTED), ids=["/".join(key) for key in EXPECTED])
def test_each_agent_cell_shows_its_outcome_exit_status_requests_and_own_words(agents_run, key):
    cell = _cells(agents_run)[key]
    outcome, status, requests, words = EXPECTED[key]
    report = cell["report"]
    assert (cell["outcome"], report["exit_code"], cell["tries"]) == (outcome, status, requests), cell["why"]
    if words is None:
        assert report["error_message"] is None
        # `ok` is the worker's whole answer, as printed.
        assert report["text"] == "The quick brown fox jumps over the lazy dog. The quick brown"
    else:
        assert report["error_message"].startswith(words)


def test_through_finish_fix_no_agent_is_a_silent_truncation_or_a_hang_for_the_cut(agents_run):
    cut = [c for c in agents_run["cells"] if c["scenario"] == "cut-after-tokens-hub-close" and c["gateway"] == "finish_fix"]
    assert len(cut) == 5
    assert {c["outcome"] for c in cut} <= {"ok", "error"}


def test_the_cut_is_after_exactly_5_token_events_for_every_agent_request(agents_run):
    # Agents ask for their own output limit (Claude Code 32000, Pi its model's maxTokens) and add
    # their tools; the worker's bytes are still the scenario's (labs.scenario.PINNED_MAX_TOKENS),
    # so the byte-exact cut lands where the layout says: the hub saw the tunnel end there, in
    # every streaming request of every agent (Claude Code's last request is not streamed).
    scenario = load_scenario(SCENARIO_DIR / "cut-after-tokens-hub-close.toml")
    for dialect in DIALECTS:
        expected = body_bytes_through_token(response_plan(scenario.resolved, dialect=dialect), 5)
        cells = [c for c in agents_run["cells"] if c["scenario"] == scenario.name and c["dialect"] == dialect.value]
        cut = [line for c in cells for line in c["hub"] if line.startswith("tunnel")]
        assert cut and {re.sub(r"\d+", "N", line) for line in cut} == {"tunnel fin after N body bytes; hub close: clean_end"}
        assert {int(re.findall(r"\d+", line)[0]) for line in cut} == {expected}, dialect


def test_without_root_the_agents_are_refused_in_one_line():
    # The check the lab makes before a run with agents, as a user without the right to make a
    # network namespace gets it (here: a child that gives up root first).
    as_nobody = (sys.executable, "-c", "import os; os.setuid(65534); os.unshare(os.CLONE_NEWNET)")
    line = agent_refusal(("codex", "pi-ai"), unshare_check=as_nobody)
    assert line == (
        "the coding agents (codex) run in a network namespace of their own, and this process may not make one "
        "(PermissionError: [Errno 1] Operation not permitted): run the lab as root, or leave them out"
    )


def test_a_sandbox_told_to_stop_takes_the_agents_whole_session_with_it(tmp_path):
    # The lab stopping (or dying: the launcher's parent-death signal is a SIGTERM) stops the
    # sandbox; what the agent started in its session must not outlive it, in the namespace or out.
    marker = f"299.{os.getpid()}"  # a duration no other process sleeps: how to find them in /proc
    agent = ["sh", "-c", f"sleep {marker} & sleep {marker}"]
    files = {name: tmp_path / name for name in ("out", "err", "report.json")}
    sandbox = start_child(
        [
            sys.executable, "-m", "labs.clients.agent_sandbox", "--port", "1", "--bridge", str(tmp_path / "bridge"),
            "--deadline", "300", "--stdout", str(files["out"]), "--stderr", str(files["err"]),
            "--report", str(files["report.json"]), "--cwd", str(tmp_path), "--", *agent,
        ]
    )  # fmt: skip

    def sleepers() -> list[str]:
        return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and marker.encode() in _cmdline(p)]

    def sleeping() -> int:
        # Only the two `sleep`s, by their whole command line: before its exec a child forked by the
        # sandbox shows the sandbox's (which holds the marker), and one is forked before the sandbox
        # takes its signals (`ldconfig -p`: trio's import asks ctypes for libpthread); counting it sent
        # SIGTERM too soon, and the sandbox died of it (CI's -15).
        return sum(_cmdline(p) == f"sleep\0{marker}\0".encode() for p in Path("/proc").iterdir() if p.name.isdigit())

    wait_until(lambda: sleeping() >= 2, "the agent's two sleeps started")
    sandbox.send_signal(signal.SIGTERM)
    assert sandbox.wait(timeout=DEADLINE) == 0
    # Signalled, they are gone once the kernel has run their exit, which a busy machine may put off
    # a moment; left alive, they would sleep for 299 s, far past the wait's deadline.
    wait_until(lambda: sleepers() == [], "the agent's processes gone with the sandbox")
    assert json.loads(files["report.json"].read_text())["interfaces"] == ["lo"]


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""
