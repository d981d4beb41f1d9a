"""What gemini-cli does, run headless by the lab in Gemini, through `direct` and `finish_fix`, pinned.

One real lab run (the module's fixture): gemini-cli 0.61.0 (`gemini -p ... -m MODEL --output-format
json`, its @google/genai 1.30.0 at `GOOGLE_GEMINI_BASE_URL`) in a loopback-only network namespace,
one prompt per cell, in `healthy`, `reason-omitted`, `cut-after-tokens-hub-close` (5 tokens, then
the hub ends the response cleanly) and `cut-after-tokens-reset` (5 tokens, then a reset). Each
expectation was measured here and read in its bundle (shared/notes/gemini.md §5 gives the source
lines; an upgrade fails `PINNED_VERSION` first: re-read them, then the pins):

- A stream that ends without a truthy `finishReason` is an `InvalidStreamError` (`NO_FINISH_REASON`,
  "Model stream ended without a finish reason."), which `geminiChat.ts` retries unconditionally:
  4 attempts, 1, 2 and 4 s apart (`MID_STREAM_RETRY_OPTIONS`). Then headless mode gives up on the
  turn and **exits 0**, each attempt's partial text in its answer, the failure in its JSON
  output's `error` (`INVALID_STREAM`); in text mode only an `[ERROR] ...` line on stderr. The lab
  reads the JSON: an `error` with exit 0.
- finish_fix appends `data: {"error": {...}}` to a stream that ends without a reason (rule G2). The
  @google/genai 1.30.0 bundled in gemini-cli checks only raw network reads for an error object,
  not a `data:` frame's, so the frame is a chunk with no candidates: still no finish reason,
  retried the same, the same `INVALID_STREAM` with exit 0. finish_fix cannot make it raise; it
  is an `error` because gemini-cli itself reports it, never a silent end.
- A reset mid-stream, straight from the tunnel, ends in a fatal error: exit 1, its JSON document
  on stderr, `Error: terminated` (undici's `TypeError: terminated`, caused by `UND_ERR_SOCKET`
  "other side closed": the socket read an end, not `ECONNRESET`; that code is not in its
  `RETRYABLE_NETWORK_CODES`, `packages/core/src/utils/retry.ts`). How many requests come first varies from run to run (1 or 2 measured here, 4 at most:
  an attempt whose end reads as a retryable network error is retried). Through finish_fix the
  reset becomes its appended error frame and a clean end: the `INVALID_STREAM` of a cut.

Every cell ran in a network namespace whose only interface is `lo`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.scenario import SCENARIO_DIR, load_scenario
from labs.worker.wire import response_plan
from tests.fixtures_chaos import run_lab_over
from tests.fixtures_lab import body_bytes_through_token

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="the coding agents need root: each runs in a network namespace of its own"),
]

SCENARIOS = ("healthy", "reason-omitted", "cut-after-tokens-hub-close", "cut-after-tokens-reset")
GATEWAYS = ("direct", "finish_fix")
#: The run takes about a minute here (a failing cell lasts its 4 attempts, 1 + 2 + 4 s apart).
RUN_DEADLINE_S = 480
PINNED_VERSION = "0.61.0"
ANSWER = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def gemini_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # `agents = true` for the reset too: asked for by name, a scenario runs the agents.
    return run_lab_over(
        SCENARIOS,
        Path(tmp_path_factory.mktemp("lab-results")),
        clients=("gemini-cli",),
        gateways=GATEWAYS,
        dialects=(Dialect.GEMINI,),
        deadline=RUN_DEADLINE_S,
        each={"gateways": GATEWAYS, "agents": True},
    )


INVALID_STREAM = "INVALID_STREAM: Model stream ended without a finish reason."
GAVE_UP = ("error", 0, range(4, 5), INVALID_STREAM)
OK = ("ok", 0, range(1, 2), None)

# (scenario, gateway): (outcome, exit status, the requests the worker saw, the start of the agent's
# error words, None when it told of none).
EXPECTED: dict[tuple[str, str], tuple[str, int, range, str | None]] = {
    ("healthy", "direct"): OK,
    ("healthy", "finish_fix"): OK,
    ("reason-omitted", "direct"): GAVE_UP,
    ("reason-omitted", "finish_fix"): GAVE_UP,
    ("cut-after-tokens-hub-close", "direct"): GAVE_UP,
    ("cut-after-tokens-hub-close", "finish_fix"): GAVE_UP,
    ("cut-after-tokens-reset", "direct"): ("error", 1, range(1, 5), "Error: terminated"),
    ("cut-after-tokens-reset", "finish_fix"): GAVE_UP,
}


def test_the_run_reports_the_pinned_gemini_cli(gemini_run):
    assert gemini_run["versions"]["agents"]["gemini-cli"] == PINNED_VERSION


def test_every_gemini_cli_cell_ran_with_no_network_interface_but_lo(gemini_run):
    assert {(c["scenario"], c["gateway"]) for c in gemini_run["cells"]} == set(EXPECTED)
    assert {tuple(c["report"]["interfaces"]) for c in gemini_run["cells"]} == {("lo",)}


@pytest.mark.parametrize("key", list(EXPECTED), ids=["/".join(key) for key in EXPECTED])
def test_each_gemini_cli_cell_shows_its_outcome_exit_status_requests_and_own_words(gemini_run, key):
    cell = next(c for c in gemini_run["cells"] if (c["scenario"], c["gateway"]) == key)
    outcome, status, requests, words = EXPECTED[key]
    report = cell["report"]
    assert (cell["outcome"], report["exit_code"]) == (outcome, status), cell["why"]
    assert cell["tries"] in requests
    if words is None:
        assert report["error_message"] is None
        assert report["text"] == ANSWER
    else:
        assert report["error_message"].startswith(words), report["error_message"]


def test_through_finish_fix_every_fault_is_an_error_never_a_silent_end(gemini_run):
    faults = [c for c in gemini_run["cells"] if c["gateway"] == "finish_fix" and c["scenario"] != "healthy"]
    assert len(faults) == 3
    assert {c["outcome"] for c in faults} == {"error"}


def test_the_hub_cut_every_request_after_exactly_5_token_events(gemini_run):
    # gemini-cli asks for no output limit; the worker's bytes are the scenario's, so the hub saw
    # each of its requests end where the layout says: 4 attempts through each gateway.
    scenario = load_scenario(SCENARIO_DIR / "cut-after-tokens-hub-close.toml")
    expected = body_bytes_through_token(response_plan(scenario.resolved, dialect=Dialect.GEMINI), 5)
    cut = [line for c in gemini_run["cells"] if c["scenario"] == scenario.name for line in c["hub"] if line.startswith("tunnel")]
    assert len(cut) == 8, cut
    assert {re.sub(r"\d+", "N", line) for line in cut} == {"tunnel fin after N body bytes; hub close: clean_end"}
    assert {int(re.findall(r"\d+", line)[0]) for line in cut} == {expected}
