"""Rule 1 through LiteLLM 1.108.7 with the spare worker at `order: 2` (labs/gateways/litellm_proxy.py),
real clients, the real proxy, the hub and two workers, pinned against LiteLLM's router source
(`.venv/.../litellm/router.py`):

- `Router._acompletion` reads the stream's first chunk (`_aread_first_chunk`) before it returns,
  so a stream that fails before its first chunk raises inside `async_function_with_retries` and
  the fallbacks; `utils.get_order_filtered_deployments` sends every attempt to the lowest order,
  and `async_function_with_fallbacks_common_utils` ("ORDER-BASED FALLBACKS") then tries order 2
  with the same model name: the spare's full answer.
- A stream that ends cleanly with no chunk (the hub's `close` during prefill) raises nothing: no
  retry, no fallback; its success handler books it through `async_log_stream_event`, a success
  with no usage (labs/gateways/litellm_books.py).
- finish_fix between LiteLLM and the worker turns that clean end into an error event
  (`stream_interrupted`); the OpenAI SDK under LiteLLM raises it on the first chunk, and the
  retry-then-fallback path above gives the client the spare's answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_chaos import run_lab_over
from tests.fixtures_lab import CELL_BACKSTOP_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

CLIENTS = ("openai-python", "pi-ai")
GATEWAYS = ("litellm", "litellm+finish_fix")
CLOSE = "rule1-prefill-cut-hub-close-spare"
ABORT = "rule1-prefill-cut-hub-abort-spare"
#: LiteLLM alone takes 15-60 s to start on a busy 2-core machine.
MATRIX_DEADLINE_S = 360


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], dict[str, Any]]:
    result = run_lab_over(
        (CLOSE, ABORT),
        Path(tmp_path_factory.mktemp("litellm-spare")),
        clients=CLIENTS,
        gateways=GATEWAYS,
        deadline=MATRIX_DEADLINE_S,
        jobs=8,
        # Both end by themselves (the spare answers): the cells' deadline is only a backstop.
        each={"gateways": GATEWAYS, "clients": CLIENTS, "deadline_s": CELL_BACKSTOP_S},
    )
    return {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"]}


@pytest.mark.parametrize("client", CLIENTS)
def test_litellm_falls_back_to_the_spare_when_the_stream_fails_before_its_first_chunk(matrix, client):
    cell = matrix[(ABORT, client, "litellm")]
    assert (cell["outcome"], cell["answered_by"]) == ("ok", "spare")
    assert (cell["books"], cell["books_mismatch"]) == ("ok", False)


@pytest.mark.parametrize("client", CLIENTS)
def test_litellm_cannot_retry_a_clean_empty_end_and_books_it_as_a_success(matrix, client):
    # Its success handler books the empty stream through `async_log_stream_event` (see
    # labs/gateways/litellm_books.py): a success, flagged.
    cell = matrix[(CLOSE, client, "litellm")]
    assert (cell["outcome"], cell["answered_by"]) == ("silent-truncation", "primary")
    assert (cell["books"], cell["books_entry"]["hook"], cell["books_mismatch"]) == ("ok", "async_log_stream_event", True)


@pytest.mark.parametrize("scenario", [CLOSE, ABORT])
@pytest.mark.parametrize("client", CLIENTS)
def test_finish_fix_behind_litellm_makes_every_prefill_cut_a_retry_on_the_spare(matrix, scenario, client):
    cell = matrix[(scenario, client, "litellm+finish_fix")]
    assert (cell["outcome"], cell["answered_by"]) == ("ok", "spare")
    assert cell["books"] == "ok"
