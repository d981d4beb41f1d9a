"""`--repeat N`: every cell runs N times, and a cell whose repeats differ is unstable.

The runner numbers each repeat of a cell as a cell of its own (its own id, so its requests, its
attempts and its books entry are its own) and runs a scenario's repeats one after another. When
the run is over, `merge_repeats` folds the N results of each matrix position (scenario, dialect,
gateway, client) into one cell:

- `repeats`: every repeat's outcome and books, in the order they ran;
- `unstable`: whether the repeats differ in outcome, in the books' word, or in whether the books
  disagree with the client (Envoy's `DC` books flip between ok and error while every client says
  `ok`: that is a flip of the books alone);
- the cell itself (its outcome, report, attempts, books entry) is the repeat whose outcome the most
  repeats had, the louder one on a tie (`Outcome.severity`), so a flip never shows the quieter word
  alone; the terminal marks it `~` and the report shows the split (`split_text`: `ok 2 / error 1`).

A run without `--repeat` (N = 1) is left exactly as it was: no `repeats`, never `unstable`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from labs.cell_result import CellResult

__all__ = ["merge_repeats", "repeat_record", "split_text"]


def repeat_record(result: CellResult) -> dict[str, Any]:
    """What `repeats` keeps of one repeat: enough to see what differed, and which cell id to look up."""
    return {
        "repeat": result.repeat,
        "cell_id": result.cell_id,
        "outcome": result.outcome,
        "books": result.books,
        "books_mismatch": result.books_mismatch,
        "tries": result.tries,
        "total_s": result.total_s,
    }


def _differ(records: list[dict[str, Any]]) -> bool:
    keys = {(r["outcome"], r["books"], r["books_mismatch"]) for r in records}
    return len(keys) > 1


def merge_repeats(results: list[CellResult], repeats: int) -> list[CellResult]:
    """One cell per matrix position from `repeats` runs of each (see the module's docstring), in
    the order of each position's first repeat; `results` unchanged when `repeats` is 1."""
    if repeats == 1:
        return results
    positions: dict[tuple[str, str, str, str], list[CellResult]] = {}
    for result in sorted(results, key=lambda r: (r.repeat, r.cell_id)):
        positions.setdefault((result.scenario, result.dialect, result.gateway, result.client), []).append(result)
    merged = []
    for runs in positions.values():
        records = [repeat_record(r) for r in runs]
        counts = Counter(r.outcome for r in runs)
        # Most repeats first; on a tie the louder word (a flip between ok and error shows error).
        shown = max(runs, key=lambda r: (counts[r.outcome], r.outcome.severity, -r.repeat))
        merged.append(dataclasses.replace(shown, repeats=records, unstable=_differ(records)))
    return merged


def split_text(cell: dict[str, Any]) -> str:
    """How a cell's repeats split, most frequent first: `ok 2 / error 1` (outcomes), with the books'
    words when those differ too (`ok 3; books ok 2 / error 1`); `""` for a cell run once."""
    records = cell.get("repeats") or []
    if not records:
        return ""

    def tally(words: list[str]) -> str:
        return " / ".join(f"{word} {count}" for word, count in Counter(words).most_common())

    text = tally([r["outcome"] for r in records])
    books = [r["books"] or "none" for r in records]
    marks = {r["books_mismatch"] for r in records}
    if len(set(books)) > 1 or len(marks) > 1:
        text += "; books " + tally([b + ("!" if r["books_mismatch"] else "") for b, r in zip(books, records)])
    return text
