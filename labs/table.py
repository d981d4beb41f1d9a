"""The matrix as a terminal table: one block per gateway, scenario rows, client columns.

Cells show the outcome words themselves (`ok`, `error`, `flagged`, `hang`, `silent-truncation`),
coloured on a terminal; a trailing `!` marks a cell whose gateway books disagree with what the client saw. For a
gateway that keeps books, a last column counts what the books recorded for the row.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from labs.outcome import Outcome, change

__all__ = ["render_table"]

_COLOURS = {
    Outcome.OK.value: "\033[32m",
    Outcome.ERROR.value: "\033[33m",
    Outcome.FLAGGED.value: "\033[36m",
    Outcome.HANG.value: "\033[35m",
    Outcome.SILENT_TRUNCATION.value: "\033[1;31m",
}
_RESET = "\033[0m"


def _pad(text: str, width: int, colour: bool, word: str | None = None) -> str:
    padded = text.ljust(width)
    if colour and word in _COLOURS:
        return _COLOURS[word] + padded + _RESET
    return padded


def render_table(result: dict[str, Any], *, colour: bool = False) -> str:
    """Render a lab result (the JSON form, `LabResult.to_json()`) as text."""
    cells = {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"]}
    scenarios = [s for s in result["scenarios"] if any(k[0] == s["name"] for k in cells)]
    lines: list[str] = []
    name_width = max([len("scenario")] + [len(s["name"]) for s in scenarios])
    for gateway in result["gateways"]:
        clients = [c for c in result["clients"] if any(k[1] == c and k[2] == gateway for k in cells)]
        if not clients:
            continue
        has_books = any(cells[k].get("books_entry") is not None or cells[k].get("books") for k in cells if k[2] == gateway)
        widths = [max(len(client), len(Outcome.SILENT_TRUNCATION.value) + 1) for client in clients]
        header = "scenario".ljust(name_width) + "  " + "  ".join(c.ljust(w) for c, w in zip(clients, widths))
        if has_books:
            header += "  books"
        lines.append(f"gateway: {gateway}")
        lines.append(header)
        lines.append("-" * len(header))
        for scenario in scenarios:
            row = [scenario["name"].ljust(name_width)]
            books = Counter()
            for client, width in zip(clients, widths):
                cell = cells.get((scenario["name"], client, gateway))
                if cell is None:
                    row.append("".ljust(width))
                    continue
                mark = "!" if cell.get("books_mismatch") else ""
                row.append(_pad(cell["outcome"] + mark, width, colour, cell["outcome"]))
                books[cell.get("books") or "none"] += 1
            line = "  ".join(row)
            if has_books:
                line += "  " + ", ".join(f"{word} {count}" for word, count in sorted(books.items()))
            lines.append(line)
        lines.append("")
    if any(c.get("books_mismatch") for c in result["cells"]):
        lines.append("! the gateway's books disagree with what the client saw, or have no entry for the request")
    lines += _compared_with_direct(result, cells)
    counts = Counter(c["outcome"] for c in result["cells"])
    lines.append(
        "cells: " + ", ".join(f"{word} {counts.get(word, 0)}" for word in (o.value for o in Outcome))
        + f"; {len(result['cells'])} in {result['duration_s']:.0f} s"
    )
    return "\n".join(lines)


#: The gateway the others are compared with (as in the HTML report).
BASELINE = "direct"


def _compared_with_direct(result: dict[str, Any], cells: dict[tuple[str, str, str], dict[str, Any]]) -> list[str]:
    """Per gateway, how many cells it made better, worse or left as `direct` had them (same
    scenario and client); the HTML report shows which."""
    if BASELINE not in result["gateways"]:
        return []
    rows = []
    for gateway in result["gateways"]:
        if gateway == BASELINE:
            continue
        tally = Counter(
            change(cells[(scenario, client, BASELINE)]["outcome"], cell["outcome"])
            for (scenario, client, name), cell in cells.items()
            if name == gateway and (scenario, client, BASELINE) in cells
        )
        if tally:
            rows.append(f"  {gateway:<{max(len(g) for g in result['gateways'])}}  "
                        f"better {tally['better']}, worse {tally['worse']}, same {tally['same']}")
    return ["compared with direct (same scenario and client):", *rows, ""] if rows else []
