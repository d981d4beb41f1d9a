"""The matrix as a terminal table: per dialect, one block per gateway, scenario rows, client columns.

A run in more than one dialect (or in one other than Chat) gets a heading per dialect, Chat first;
under it, the gateways the lab does not send that dialect through get one `n/a` line each, saying
why. A Chat-only run is laid out as before there were dialects.

Cells show the outcome words themselves (`ok`, `error`, `flagged`, `hang`, `silent-truncation`),
coloured on a terminal; a trailing `!` marks a cell whose gateway books disagree with what the client saw,
`(3)` that the upstream saw 3 tries for it, `~` that its repeats differ (`--repeat`, labs.repeat). For a
gateway that keeps books, a last column counts what the books recorded for the row.

The coding agents' cells (labs.clients.agent_host) are listed once more under the blocks, one line
each, with what their user saw: the exit status, the requests the worker saw for the cell (agents
retry), and the agent's own last error line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.outcome import Change, Outcome, change
from labs.repeat import split_text

__all__ = ["cell_text", "dialect_of", "dialects_of", "render_table", "translated_from", "with_headings"]

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


def dialects_of(result: dict[str, Any]) -> list[str]:
    """The dialects a lab result holds (cells or `n/a` gateways), in `Dialect` order; a result
    from before there were dialects holds Chat only."""
    present = {dialect_of(c) for c in result["cells"]} | {n["dialect"] for n in result.get("not_applicable", [])}
    return [d.value for d in LAB_DIALECTS if d.value in present]


def dialect_of(item: dict[str, Any]) -> str:
    """A cell's or scenario entry's dialect (Chat for one written before there were dialects)."""
    return item.get("dialect", Dialect.CHAT.value)


def translated_from(cells: list[dict[str, Any]]) -> str | None:
    """The dialect the worker spoke for a gateway's cells in one dialect when the gateway
    translated them (its route: LiteLLM's bridges), else None."""
    upstreams = {c.get("upstream_dialect") or dialect_of(c) for c in cells}
    if len(upstreams) != 1 or any(u == dialect_of(c) for c in cells for u in upstreams):
        return None
    return upstreams.pop()


def with_headings(result: dict[str, Any]) -> bool:
    """Whether the matrix needs a heading per dialect: not for a Chat-only run, laid out as ever."""
    return dialects_of(result) not in ([], [Dialect.CHAT.value])


def render_table(result: dict[str, Any], *, colour: bool = False) -> str:
    """Render a lab result (the JSON form, `LabResult.to_json()`) as text: per dialect (a heading
    each, unless the run is Chat only), one block per gateway, then one `n/a` line per gateway the
    lab does not send that dialect through."""
    cells = {(c["scenario"], dialect_of(c), c["client"], c["gateway"]): c for c in result["cells"]}
    lines: list[str] = []
    headings = with_headings(result)
    names = [s["name"] for s in result["scenarios"] if any(k[0] == s["name"] for k in cells)]
    name_width = max([len("scenario")] + [len(name) for name in names])
    for dialect in dialects_of(result):
        if headings:
            lines += [f"dialect: {dialect}", "=" * len(f"dialect: {dialect}"), ""]
        lines += _dialect_blocks(result, cells, dialect, name_width, colour)
        unserved = [n for n in result.get("not_applicable", []) if n["dialect"] == dialect]
        if unserved:
            lines += [f"n/a  {n['why']}" for n in unserved] + [""]
    if any(c.get("books_mismatch") for c in result["cells"]):
        lines.append("! the gateway's books disagree with what the client saw, or have no entry for the request")
    if any((c.get("tries") or 0) > 1 for c in result["cells"]):
        lines.append("(N) the upstream saw N tries for the cell (the gateway's and the client's retries)")
    unstable = [c for c in result["cells"] if c.get("unstable")]
    if unstable:
        lines.append(f"~ unstable: the cell's {result.get('repeat', '')} repeats differ in outcome or books:")
        lines += [f"    {c['gateway']} / {c['scenario']} ({dialect_of(c)}) / {c['client']}: {split_text(c)}" for c in unstable]
    lines += _agent_lines(result)
    lines += _compared_with_direct(result, cells, headings)
    counts = Counter(c["outcome"] for c in result["cells"])
    lines.append(
        "cells: "
        + ", ".join(f"{word} {counts.get(word, 0)}" for word in (o.value for o in Outcome))
        + f"; {len(result['cells'])} in {result['duration_s']:.0f} s"
    )
    return "\n".join(lines)


def cell_text(cell: dict[str, Any]) -> str:
    """A cell as the terminal shows it: the outcome word, the try count in brackets when the
    upstream saw more than one (`error(3)`), `!` when the books disagree, `~` when its repeats
    differ (labs.repeat)."""
    tries = cell.get("tries") or 0
    return (
        cell["outcome"]
        + (f"({tries})" if tries > 1 else "")
        + ("!" if cell.get("books_mismatch") else "")
        + ("~" if cell.get("unstable") else "")
    )


def _dialect_blocks(
    result: dict[str, Any], cells: dict[tuple[str, str, str, str], dict[str, Any]], dialect: str, name_width: int, colour: bool
) -> list[str]:
    """One dialect's blocks: one per gateway, scenario rows, client columns (the dialect's)."""
    lines: list[str] = []
    scenarios = [
        s for s in result["scenarios"] if dialect_of(s) == dialect and any(k[0] == s["name"] and k[1] == dialect for k in cells)
    ]
    order = result.get("clients_by_dialect", {}).get(dialect, result["clients"])
    for gateway in result["gateways"]:
        mine = [k for k in cells if k[1] == dialect and k[3] == gateway]
        clients = [c for c in order if any(k[2] == c for k in mine)]
        if not clients:
            continue
        has_books = any(cells[k].get("books_entry") is not None or cells[k].get("books") for k in mine)
        widths = [max(len(client), len(Outcome.SILENT_TRUNCATION.value) + 1) for client in clients]
        # Room for a try count and the unstable mark where a cell of the block has them.
        extra = max((len(cell_text(cells[k])) - len(cells[k]["outcome"]) - 1 for k in mine), default=0)
        widths = [max(width, len(Outcome.SILENT_TRUNCATION.value) + 1 + extra) for width in widths]
        header = "scenario".ljust(name_width) + "  " + "  ".join(c.ljust(w) for c, w in zip(clients, widths))
        if has_books:
            header += "  books"
        upstream = translated_from([cells[k] for k in mine])
        lines.append(f"gateway: {gateway}" + (f"  (translated: the worker spoke {upstream})" if upstream else ""))
        lines.append(header)
        lines.append("-" * len(header))
        for scenario in scenarios:
            if not any(k[0] == scenario["name"] for k in mine):
                continue  # no cell of this gateway (a translating route runs only some scenarios)
            row = [scenario["name"].ljust(name_width)]
            books: Counter[str] = Counter()
            for client, width in zip(clients, widths):
                cell = cells.get((scenario["name"], dialect, client, gateway))
                if cell is None:
                    row.append("".ljust(width))
                    continue
                row.append(_pad(cell_text(cell), width, colour, cell["outcome"]))
                books[cell.get("books") or "none"] += 1
            line = "  ".join(row)
            if has_books:
                line += "  " + ", ".join(f"{word} {count}" for word, count in sorted(books.items()))
            lines.append(line)
        lines.append("")
    return lines


def _agent_lines(result: dict[str, Any]) -> list[str]:
    """One line per coding agent cell: where, the outcome, the exit status, the requests the worker
    saw, and the agent's last error line as its user saw it."""
    agent_cells = [c for c in result["cells"] if c["report"].get("interfaces") is not None]
    if not agent_cells:
        return []
    rows = [
        (
            dialect_of(c),
            c["gateway"],
            c["scenario"],
            c["client"],
            c["outcome"],
            "deadline" if c["report"]["exit_code"] is None else f"exit {c['report']['exit_code']}",
            f"{c.get('tries') or 0} request{'' if c.get('tries') == 1 else 's'}",
            c["report"].get("error_message") or "",
        )
        for c in agent_cells
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(7)]
    lines = ["coding agents (outcome, exit status, requests the worker saw, the agent's last error line):"]
    lines += ["  " + "  ".join(text.ljust(width) for text, width in zip(row, widths)) + "  " + row[7] for row in rows]
    return [*lines, ""]


#: The gateway the others are compared with (as in the HTML report).
BASELINE = "direct"


def _compared_with_direct(
    result: dict[str, Any], cells: dict[tuple[str, str, str, str], dict[str, Any]], headings: bool
) -> list[str]:
    """Per gateway (and dialect, when the run has several), how many cells it made better, worse
    or left as `direct` had them (same scenario, dialect and client; a translated cell is compared
    with the same scenario untranslated: `direct` never translates); the HTML report shows which."""
    if BASELINE not in result["gateways"]:
        return []
    rows = []
    for dialect in dialects_of(result):
        for gateway in result["gateways"]:
            if gateway == BASELINE:
                continue
            tally = Counter(
                change(cells[(scenario, dialect, client, BASELINE)]["outcome"], cell["outcome"])
                for (scenario, in_dialect, client, name), cell in cells.items()
                if name == gateway and in_dialect == dialect and (scenario, dialect, client, BASELINE) in cells
            )
            if tally:
                label = f"{gateway} ({dialect})" if headings else gateway
                upstream = translated_from([c for k, c in cells.items() if k[1] == dialect and k[3] == gateway])
                rows.append((label + (f" from {upstream}" if upstream else ""), tally))
    if not rows:
        return []
    width = max(len(label) for label, _ in rows) if headings else max(len(g) for g in result["gateways"])
    lines = [
        f"  {label:<{width}}  better {t[Change.BETTER]}, worse {t[Change.WORSE]}, same {t[Change.SAME]}" for label, t in rows
    ]
    title = (
        "compared with direct (same scenario, dialect and client):"
        if headings
        else "compared with direct (same scenario and client):"
    )
    if any(" from " in label for label, _ in rows):
        title = title[:-2] + "; `from D`: the gateway translated from the worker's D, compared untranslated):"
    return [title, *lines, ""]
