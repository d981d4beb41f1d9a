"""A card for people and programs: the terminal table, the JSON file, one self-contained HTML page,
and the Markdown table of several cards side by side (docs/grading.md "The lab's gateways, graded").

The same words everywhere: the card's marks (`labs.grade.card.Mark`) are the cell text in all four.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from labs.grade.card import Card, Mark

__all__ = ["render_cards_markdown", "render_html", "render_terminal", "write_html", "write_json"]

_MARK_COLOURS = {
    Mark.PASS: ("#d7f5d7", "\x1b[32m"),
    Mark.FAIL: ("#f6c1bd", "\x1b[31m"),
    Mark.NOT_TESTED: ("#eeeeee", "\x1b[2m"),
    Mark.NOT_CHECKED: ("#eeeeee", "\x1b[2m"),
}


def render_terminal(card: Card, *, colour: bool = False) -> str:
    """The card as aligned columns: rule, check, mark, evidence; then the counts and the exit status."""
    rows = [("rule", "check", "mark", "evidence")] + [(r.rule, r.check, str(r.mark), r.evidence) for r in card.results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [_heading(card)]
    for number, row in enumerate(rows):
        mark = row[2].ljust(widths[2])
        if colour and number:
            mark = _MARK_COLOURS[Mark(row[2])][1] + mark + "\x1b[0m"
        lines.append(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {mark}  {row[3]}")
    lines.extend(f"not run: {check}: {why}" for check, why in card.not_run.items())
    counts = ", ".join(f"{n} {mark}" for mark, n in card.counts().items() if n)
    lines.append(f"{counts}; exit status {card.exit_status}")
    return "\n".join(lines)


def _heading(card: Card) -> str:
    """`server http://.../v1`, with the dialect graded when the card names one (Messages, Responses;
    `messages from chat` for a gateway graded on a translating route)."""
    label = dialect_label(card)
    return f"{card.kind} {card.target}" + (f" ({label})" if label else "")


def write_json(card: Card, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card.to_json(), indent=2, default=str) + "\n", encoding="utf-8")


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.mark { font-family: ui-monospace, monospace; white-space: nowrap; }
details pre { white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: .5em; max-height: 20em; overflow: auto; }
"""


def render_html(card: Card) -> str:
    """One page, no external assets: the setup, then one row per check with its details folded."""
    e = html.escape
    rows = []
    for r in card.results:
        background = _MARK_COLOURS[r.mark][0]
        details = ""
        if r.details:
            details = f"<details><summary>details</summary><pre>{e(json.dumps(r.details, indent=2, default=str))}</pre></details>"
        rows.append(
            f"<tr><td>{e(r.rule)}</td><td><code>{e(r.check)}</code><br><small>{e(r.title)}</small></td>"
            f'<td class="mark" style="background:{background}">{e(str(r.mark))}</td><td>{e(r.evidence)}{details}</td></tr>'
        )
    not_run = "".join(f"<li><code>{e(check)}</code>: {e(why)}</li>" for check, why in card.not_run.items())
    not_run = f"<p>not run:</p><ul>{not_run}</ul>" if not_run else ""
    setup = "".join(
        f"<tr><th>{e(str(k))}</th><td><pre>{e(json.dumps(v, indent=1, default=str) if not isinstance(v, str) else v)}</pre></td></tr>"
        for k, v in card.setup.items()
    )
    counts = ", ".join(f"{n} {mark}" for mark, n in card.counts().items() if n)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>finishline grade: {e(card.target)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{e(_heading(card))}</h1>"
        f"<p>{e(counts)}; exit status {card.exit_status}</p>"
        f"<table><tr><th>rule</th><th>check</th><th>mark</th><th>evidence</th></tr>{''.join(rows)}</table>{not_run}"
        f"<h2>setup</h2><table>{setup}</table></body></html>\n"
    )


def write_html(card: Card, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(card), encoding="utf-8")


def dialect_label(card: Card) -> str | None:
    """The dialect a gateway card was graded in (`messages`, `messages from chat` for a translating
    route), or None for Chat's card, which is laid out as before there were dialects."""
    dialect = card.setup.get("dialect")
    if dialect is None:
        return None
    upstream = card.setup.get("upstream_dialect", dialect)
    return dialect if upstream == dialect else f"{dialect} from {upstream}"


def render_cards_markdown(cards: dict[str, Card]) -> str:
    """Several cards as one Markdown table: checks as rows, cards (gateways) as columns; with a
    `dialect` column first when the cards were graded in another dialect than Chat."""
    names = list(cards)
    order: list[tuple[str, str]] = []
    for card in cards.values():
        for r in card.results:
            if (r.rule, r.check) not in order:
                order.append((r.rule, r.check))
    labels = list(dict.fromkeys(label for card in cards.values() if (label := dialect_label(card))))
    lead = f"| {', '.join(labels)} " if labels else ""
    lines = [
        ("| dialect " if labels else "") + "| rule | check | " + " | ".join(names) + " |",
        ("| --- " if labels else "") + "| --- | --- |" + " --- |" * len(names),
    ]
    for rule, check in order:
        cells = []
        for name in names:
            try:
                cells.append(str(cards[name].result(check).mark))
            except KeyError:
                cells.append("")
        lines.append(f"{lead}| {rule} | `{check}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
