"""The lab in Gemini (issue 29, part 4): one small real run, google-genai 3.3.0 (its async client, as
the lab's driver runs it) against the simulated worker speaking Gemini, `direct` and through
finish_fix's mitmdump (its default `finish_fix_gemini_paths`), the tunnel and the hub: the control
row, the cuts finish_fix must turn into errors, the reason defects and the worker's own error frame.

What google-genai does (shared/notes/gemini.md section 4, measured here): a stream that ends without
a `finishReason` ends its iteration with no error, so `direct` shows the truncation as the
application sees it: `silent-truncation` (a cut the hub ends cleanly, no reason, `""`); a reset
raises from the transport (aiohttp's `ClientPayloadError`); the worker's `{"error": ...}` frame
raises `ClientError`/`ServerError` with its code. Through finish_fix every one of these is an error
(rule G2's frame: `ServerError: 503 UNAVAILABLE`), and finish_fix's books say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finishline import Dialect
from labs.scenario import SCENARIO_DIR, load_scenario
from tests.fixtures_chaos import run_lab_over

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GATEWAYS = ("direct", "finish_fix")
CLIENT = "google-genai"
SCENARIOS = (
    "healthy",
    "cut-after-tokens-hub-close",
    "cut-after-tokens-reset",
    "reason-omitted",
    "reason-empty",
    "error-event-429",
    "malformed-chunk",
)
#: The run takes ~15 s alone on a 2-core machine (finish_fix's start, then seven short rows).
RUN_DEADLINE_S = 240


@pytest.fixture(scope="module")
def gemini(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    result = run_lab_over(
        SCENARIOS,
        Path(tmp_path_factory.mktemp("gemini-lab")),
        clients=(CLIENT,),
        gateways=GATEWAYS,
        dialects=(Dialect.GEMINI,),
        deadline=RUN_DEADLINE_S,
        each={"dialects": (Dialect.GEMINI,), "agents": False},
    )
    cells = {(c["scenario"], c["gateway"]): c for c in result["cells"]}
    assert {c["dialect"] for c in cells.values()} == {"gemini"} and {c["client"] for c in cells.values()} == {CLIENT}
    return cells


def test_the_control_row_is_ok_direct_and_through_finish_fix_and_its_books_say_ok(gemini):
    for gateway in GATEWAYS:
        cell = gemini["healthy", gateway]
        assert cell["outcome"] == "ok", cell["why"]
        truth = load_scenario(SCENARIO_DIR / "healthy.toml").expected(Dialect.GEMINI)
        assert (cell["report"]["text"], cell["report"]["finish_reason"]) == (truth.text, "STOP")
        # usageMetadata as google-genai surfaced it, and the model the worker echoed.
        assert cell["report"]["usage"]["prompt_token_count"] == 12
    assert gemini["healthy", "finish_fix"]["books"] == "ok"


@pytest.mark.parametrize("scenario", ["cut-after-tokens-hub-close", "cut-after-tokens-reset", "reason-omitted", "reason-empty"])
def test_through_finish_fix_every_cut_and_missing_reason_is_an_error_never_a_silent_end(gemini, scenario):
    cell = gemini[scenario, "finish_fix"]
    assert cell["outcome"] == "error", cell["why"]
    assert cell["report"]["error_class"] == "ServerError" and "503 UNAVAILABLE" in cell["report"]["error_message"]
    assert cell["books"] == "error" and not cell["books_mismatch"]


def test_direct_shows_what_google_genai_does(gemini):
    # A cut at a chunk boundary (the hub ends it cleanly) and a stream without a reason read as a
    # finished answer: the partial text, no finish reason, no error.
    hidden = gemini["cut-after-tokens-hub-close", "direct"]
    assert hidden["outcome"] == "silent-truncation" and hidden["report"]["text"] == "The quick brown fox jumps"
    assert hidden["report"]["finish_reason"] is None and hidden["report"]["error_class"] is None
    for scenario in ("reason-omitted", "reason-empty"):
        cell = gemini[scenario, "direct"]
        assert cell["outcome"] == "silent-truncation", cell["why"]
        assert "finish reason None" in cell["why"]
    # A reset is the transport's error, raised as it is.
    assert gemini["cut-after-tokens-reset", "direct"]["outcome"] == "error"


def test_the_workers_error_frame_and_a_malformed_chunk_raise_in_both_columns(gemini):
    for gateway in GATEWAYS:
        error = gemini["error-event-429", gateway]
        assert error["outcome"] == "error" and error["report"]["error_class"] == "ClientError"
        assert "429 RESOURCE_EXHAUSTED" in error["report"]["error_message"]
        malformed = gemini["malformed-chunk", gateway]
        assert malformed["outcome"] == "error" and malformed["report"]["error_class"] == "UnknownApiResponseError"
