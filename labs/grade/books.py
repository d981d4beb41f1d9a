"""Rule 3's input: what a gateway's books say about one request, from a JSON-lines file it exports.

The schema (`--books FILE`), one JSON object per line, any other keys ignored:

- which request: `request_id` (the grader's request id, e.g. `c0007`), or else `model`, the model
  name as the gateway recorded it, whose first `;` item (after any route prefix such as `lab/`)
  is the request id: the grader sends it there (`c0007;tokens=12;...`);
- what the books say: `verdict` and/or `status`. A verdict of `ok`, `success`, `completed`, `clean`
  or `repaired` is a success; `error`, `failure`, `failed`, `interrupted`, `upstream_error`,
  `malformed`, `http_error`, `cancelled` or `timeout` an error. Without a known verdict, `status` decides: an
  HTTP status (>= 400 an error, else a success) or one of the same words.

finish_fix's ledger (`--set finish_fix_ledger=FILE`) is such a file as it is: its lines have
`model`, `status` and `verdict`. When several lines name one request, the last one counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finishline import Verdict
from labs.cell_ids import cell_id_of
from labs.gateways.services import last_entry_by_cell, read_books
from labs.outcome import BOOKS_ERROR, BOOKS_NO_ENTRY, BOOKS_OK

__all__ = ["BOOKS_NO_ENTRY", "books_word", "read_books_file"]

# The lab's own words and finish_fix's verdicts (its ledger), then the words other gateways' books
# use for the same two things (LiteLLM's `success`/`failure`, ...), which no code here defines.
_SUCCESS = {BOOKS_OK, Verdict.CLEAN, Verdict.REPAIRED, "success", "succeeded", "completed", "complete"}
_FAILURE = {
    BOOKS_ERROR,
    Verdict.INTERRUPTED,
    Verdict.UPSTREAM_ERROR,
    Verdict.MALFORMED,
    Verdict.HTTP_ERROR,
    "failure",
    "failed",
    "cancelled",
    "canceled",
    "timeout",
}


def _word(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return BOOKS_ERROR if value >= 400 else BOOKS_OK
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return _word(int(text))
        if text in _SUCCESS:
            return BOOKS_OK
        if text in _FAILURE:
            return BOOKS_ERROR
    return None


def books_word(entry: dict[str, Any]) -> str | None:
    """`ok` or `error` for one line, None when neither its verdict nor its status says."""
    return _word(entry.get("verdict")) or _word(entry.get("status"))


def _request_ids(entry: dict[str, Any]) -> tuple[str | None]:
    request_id = entry.get("request_id")
    return (request_id if isinstance(request_id, str) else cell_id_of(entry.get("model")),)


def read_books_file(path: Path) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """{request id: (word, the last line for it)} for every line that names a request."""
    last = last_entry_by_cell(read_books(path), _request_ids)
    return {request_id: (books_word(entry), entry) for request_id, entry in last.items()}
