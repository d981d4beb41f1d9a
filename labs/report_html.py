"""The lab's HTML report: one self-contained file (no network, no external assets).

Four views, top to bottom:

- the scorecard (labs.scorecard), per gateway and rule, each cell's evidence a link to the cell;
- the versions that decide behaviour, as a table (runtime, package, version);
- "compared with direct": per scenario, one row per gateway and one column per client, each cell
  `direct's word -> this gateway's word`, marked better, worse or the same (by `Outcome.severity`:
  a louder failure is better than a quieter one, and `ok` is best);
- the matrix itself, a colour-coded grid per gateway (scenario rows, client columns).

A run in more than one dialect (or in one other than Chat) shows the last two views once per
dialect, under a heading each, Chat first, with a table of the gateways the lab does not send that
dialect through (`n/a`, and why); a Chat-only run is laid out as before there were dialects.

The outcome words are the cell text everywhere; clicking a cell opens its details: why that
outcome, the error the client raised, the text it received, what the gateway's books say, and the
worker's stream for that scenario with the fault that was applied to it; for a coding agent, also
its exit status, the requests the worker saw, and the network interfaces it had.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from finishline import Dialect
from labs.outcome import Change, Outcome, change
from labs.repeat import split_text
from labs.scorecard import worker_line
from labs.table import dialect_of, dialects_of, translated_from, with_headings

__all__ = ["BASELINE", "OUTCOME_COLOURS", "cell_label", "render_html", "write_html"]

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table.grid { border-collapse: collapse; }
table.grid th, table.grid td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
table.grid th { background: #f4f4f4; font-weight: 600; }
td.cell { cursor: pointer; font-family: ui-monospace, monospace; white-space: nowrap; }
td.mismatch::after { content: " !"; font-weight: 700; }
td.cell small { display: block; font-size: 11px; opacity: .75; }
td.unstable { outline: 3px dashed #444; outline-offset: -3px; }
table.scorecard td.score { vertical-align: top; font-size: 12px; }
table.scorecard a.evidence { display: block; color: inherit; }
#details { position: fixed; top: 0; right: 0; width: 42%; height: 100%; overflow: auto;
           background: #fff; border-left: 2px solid #888; padding: 1em; display: none; box-sizing: border-box; }
#details pre { white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: .5em; max-height: 22em; overflow: auto; }
#details .close { float: right; cursor: pointer; font-size: 1.3em; }
.legend span { padding: 2px 8px; margin-right: 6px; border: 1px solid #ccc; }
table.versions td, table.versions th { padding: 2px 10px 2px 0; border: none; text-align: left; }
table.versions th { font-weight: 600; vertical-align: top; }
table.versions td.version { font-family: ui-monospace, monospace; }
table.changes th.scenario { vertical-align: top; max-width: 16em; }
table.changes th.scenario small { display: block; font-weight: 400; opacity: .75; }
table.changes tr.first-of-scenario > * { border-top: 3px solid #888; }
table.changes td.cell { white-space: normal; font-size: 12px; min-width: 7em; }
table.changes td.same { opacity: .45; }
table.changes td.better { outline: 3px solid #1f8f3a; outline-offset: -3px; }
table.changes td.worse { outline: 3px solid #b3261e; outline-offset: -3px; }
table.changes td.better::before { content: "▲ "; color: #1f8f3a; }
table.changes td.worse::before { content: "▼ "; color: #b3261e; }
table.changes td.silent-truncation.worse::before, table.changes td.silent-truncation.better::before { color: #fff; }
table.changes th.baseline, table.changes td.baseline { border-bottom: 2px solid #888; }
table.tally td { text-align: right; }
"""

#: Each outcome word's background and text colour: the grids, the legend and the comparison.
OUTCOME_COLOURS = {
    Outcome.OK: ("#d7f5d7", "#222"),
    Outcome.ERROR: ("#fde9b8", "#222"),
    Outcome.FLAGGED: ("#cfe3fb", "#222"),
    Outcome.HANG: ("#e6d3f5", "#222"),
    Outcome.SILENT_TRUNCATION: ("#d9302c", "#fff"),
}
#: The gateway every other one is compared with: the client talking to the worker's tunnel itself.
BASELINE = "direct"
_STYLE += "".join(
    f"td.{outcome.value} {{ background: {background}; color: {text};"
    f"{' font-weight: 700;' if outcome is Outcome.SILENT_TRUNCATION else ''} }}\n"
    for outcome, (background, text) in OUTCOME_COLOURS.items()
)

_SCRIPT = """
const data = JSON.parse(document.getElementById('lab-data').textContent);
const cells = Object.fromEntries(data.cells.map(c => [c.cell_id, c]));
// One scenario entry per scenario and dialect (a result from before dialects: Chat only).
const scenarios = Object.fromEntries(data.scenarios.map(s => [s.name + ' ' + (s.dialect ?? 'chat'), s]));
function esc(t) { return String(t ?? '').replace(/[&<>]/g, ch => ({'&':'&amp;','<':'&lt;','>':'&gt;'}[ch])); }
function show(id) {
  const c = cells[id], s = scenarios[c.scenario + ' ' + (c.dialect ?? 'chat')], r = c.report;
  // The worker spoke the route's dialect; its stream and the fault on it are in that one.
  const upstream = c.upstream_dialect ?? c.dialect ?? 'chat', w = scenarios[c.scenario + ' ' + upstream] ?? s;
  const rows = [
    ['outcome', c.outcome], ['why', c.why], ['dialect', (c.dialect ?? 'chat') + (upstream !== (c.dialect ?? 'chat') ? ' (translated: the worker spoke ' + upstream + ')' : '')], ['client', c.client], ['gateway', c.gateway],
    ['completed', r.completed], ['finish reason surfaced', r.finish_reason], ['error', r.error_class ? r.error_class + ': ' + r.error_message : ''],
    ['time to first token', r.ttft_s == null ? '' : r.ttft_s.toFixed(3) + ' s'], ['duration', r.duration_s == null ? '' : r.duration_s.toFixed(3) + ' s'],
    ['HTTP status / Connection', (r.http_status ?? '') + ' / ' + (r.connection ?? '')],
    // A coding agent's cell (labs.clients.agent_host): what its user saw, and where it ran.
    ...(r.interfaces == null ? [] : [['exit status', r.exit_code ?? 'none: stopped at the deadline'],
      ['requests the worker saw', c.tries ?? ''], ['network interfaces it had', r.interfaces.join(', ')],
      ['its output and command', 'agents/' + c.cell_id + '/ in the run folder']]),
    ['books', (c.books ?? 'no books kept') + (c.books_mismatch ? '  (disagrees with what the client saw!)' : '')],
    ['topology', c.topology ?? ''],
    // The failover suites' evidence (labs.evidence): the attempts' spacing, and the healthy probe after the cell.
    ['first gap (attempt 1 to 2)', c.first_gap_s == null ? 'one attempt or none' : c.first_gap_s.toFixed(2) + ' s'],
    ['most attempts in one second', c.max_attempts_per_s ?? ''],
    ['probe after the cell', c.probe == null ? 'none (an agent\\'s cell)' : (c.probe.ok ? 'ok' : 'NOT ok: ' + c.probe.outcome + ': ' + c.probe.why) + ' (' + c.probe.cell_id + ', ' + (c.probe.tries ?? '?') + ' tries)'],
    ['answered by', c.answered_by === undefined ? '' : (c.answered_by ?? 'no worker saw the request') +
      (c.worker_requests && Object.keys(c.worker_requests).length ? '  (requests: ' + Object.entries(c.worker_requests).map(([w, n]) => w + ' ' + n).join(', ') + ')' : '')],
  ];
  let out = '<span class="close" onclick="hide()">&times;</span><h2>' + esc(c.scenario) + ' / ' + esc(c.client) + ' via ' + esc(c.gateway) + '</h2><table>';
  for (const [k, v] of rows) out += '<tr><th>' + esc(k) + '</th><td>' + esc(v) + '</td></tr>';
  out += '</table><h3>text received (' + r.text.length + ' of ' + s.expected.text.length + ' characters)</h3><pre>' + esc(r.text) + '</pre>';
  if (r.reasoning) out += '<h3>reasoning received</h3><pre>' + esc(r.reasoning) + '</pre>';
  if (r.tool_calls && r.tool_calls.length) out += '<h3>tool calls</h3><pre>' + esc(JSON.stringify(r.tool_calls, null, 1)) + '</pre>';
  out += '<h3>worker\\'s answer</h3><pre>' + esc(s.expected.text) + '  [finish_reason: ' + esc(s.expected.finish_reason) + ']</pre>';
  if (s.expected.http_error) out += '<p>The worker answers HTTP ' + esc(s.expected.http_error) + ' before streaming.</p>';
  if (s.expected.tool_calls && s.expected.tool_calls.length) out += '<h3>worker\\'s tool calls</h3><pre>' + esc(JSON.stringify(s.expected.tool_calls, null, 1)) + '</pre>';
  if (c.hub && c.hub.length) out += '<h3>what the hub did</h3><pre>' + esc(c.hub.join('\\n')) + '</pre>';
  if (c.attempts && c.attempts.length) {
    const t0 = c.attempts[0].arrived_at, secs = v => v == null ? '' : v.toFixed(2) + ' s';
    out += '<h3>attempts (' + (c.tries ?? c.attempts.length) + ' tries; first token ' + secs(c.first_token_s) + ', total ' + secs(c.total_s) + ')</h3><table class="grid"><tr><th>at</th><th>arrived</th><th>head</th><th>first token</th><th>ended</th><th>status</th></tr>';
    for (const a of c.attempts) out += '<tr><td>' + esc(a.at) + '</td><td>+' + esc((a.arrived_at - t0).toFixed(2)) + ' s</td><td>' + esc(secs(a.head_s)) + '</td><td>' + esc(secs(a.first_token_s)) + '</td><td>' + esc(a.ended) + '</td><td>' + esc(a.status) + '</td></tr>';
    out += '</table>';
  }
  if (c.requests && c.requests.length) {
    out += '<h3>requests (' + c.requests.length + ', one after another)</h3><table class="grid"><tr><th>#</th><th>outcome</th><th>seconds</th><th>why</th></tr>';
    c.requests.forEach((q, i) => { out += '<tr><td>' + (i + 1) + '</td><td>' + esc(q.outcome) + '</td><td>' + esc(q.total_s == null ? '' : q.total_s.toFixed(2)) + '</td><td>' + esc(q.why) + '</td></tr>'; });
    out += '</table>';
  }
  if (c.repeats && c.repeats.length) {
    out += '<h3>repeats' + (c.unstable ? ' (unstable)' : '') + '</h3><table class="grid"><tr><th>#</th><th>cell</th><th>outcome</th><th>books</th><th>tries</th></tr>';
    for (const r of c.repeats) out += '<tr><td>' + esc(r.repeat) + '</td><td>' + esc(r.cell_id) + '</td><td>' + esc(r.outcome) + '</td><td>' + esc((r.books ?? '') + (r.books_mismatch ? ' !' : '')) + '</td><td>' + esc(r.tries) + '</td></tr>';
    out += '</table>';
  }
  if (c.books_entry) out += '<h3>books entry</h3><pre>' + esc(JSON.stringify(c.books_entry, null, 1)) + '</pre>';
  if (c.finish_fix_stream != null) out += '<h3>stream as finish_fix sent it on' + (c.gateway === 'finish_fix' ? ' (to the client)' : ' (to ' + esc(c.gateway.split('+')[0]) + ')') + '</h3><pre>' + esc(c.finish_fix_stream) + '</pre>';
  out += '<h3>worker\\'s stream (' + esc(upstream) + ')</h3><p>fault: ' + esc(w.fault_summary || 'none') + '</p><pre>' + esc(w.worker_stream) + '</pre>';
  out += '<p>request model: <code>' + esc(c.request_model) + '</code></p>';
  const d = document.getElementById('details'); d.innerHTML = out; d.style.display = 'block';
}
function hide() { document.getElementById('details').style.display = 'none'; }
document.querySelectorAll('td.cell').forEach(td => td.addEventListener('click', () => show(td.dataset.id)));
// The scorecard's evidence: each link opens the cell it names (the cell shown for its position).
document.querySelectorAll('a.evidence').forEach(a => a.addEventListener('click', e => { e.preventDefault(); show(a.dataset.id); }));
"""


def _clients(result: dict[str, Any], dialect: str) -> list[str]:
    """The dialect's client columns, in its order (every client, for a result from before dialects)."""
    return result.get("clients_by_dialect", {}).get(dialect, result["clients"])


def _grid(result: dict[str, Any], gateway: str, dialect: str = Dialect.CHAT.value) -> str:
    cells = {(c["scenario"], c["client"]): c for c in result["cells"] if c["gateway"] == gateway and dialect_of(c) == dialect}
    clients = [c for c in _clients(result, dialect) if any(k[1] == c for k in cells)]
    if not clients:
        return ""
    route = result.get("routes", {}).get(gateway, {}).get(dialect)
    upstream = translated_from(list(cells.values()))
    note = " ".join(
        part
        for part in (
            f"Translated: the worker spoke {upstream}." if upstream else "",
            f"Route: {route}." if route else "",
        )
        if part
    )
    parts = [f"<h2>gateway: {html.escape(gateway)}</h2>", f"<p>{html.escape(note)}</p>" if note else ""]
    parts.append('<table class="grid"><tr><th>scenario</th>')
    parts += [f"<th>{html.escape(c)}</th>" for c in clients]
    parts.append("</tr>")
    for scenario in result["scenarios"]:
        if dialect_of(scenario) != dialect or not any(k[0] == scenario["name"] for k in cells):
            continue
        parts.append(f'<tr><th title="{html.escape(scenario["title"])}">{html.escape(scenario["name"])}</th>')
        for client in clients:
            cell = cells.get((scenario["name"], client))
            if cell is None:
                parts.append("<td></td>")
                continue
            books = f"<small>books: {html.escape(cell['books'])}</small>" if cell.get("books") else ""
            parts.append(_cell_td(cell, cell_label(cell) + _spare(cell) + books + _split(cell)))
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


def _versions(versions: dict[str, Any]) -> str:
    """The versions block: runtime, package, version; one row per package (in the order the host
    reported them: the runtime itself first), the runtime named once."""
    if not versions:
        return "<p>No versions recorded.</p>"
    rows = []
    for runtime, packages in sorted(versions.items()):
        items = list(packages.items()) if isinstance(packages, dict) else [("", packages)]
        for number, (package, version) in enumerate(items):
            runtime_cell = f'<th rowspan="{len(items)}">{html.escape(runtime)}</th>' if number == 0 else ""
            rows.append(
                f'<tr>{runtime_cell}<td>{html.escape(str(package))}</td><td class="version">{html.escape(str(version))}</td></tr>'
            )
    return '<table class="versions"><tr><th>runtime</th><th>package</th><th>version</th></tr>' + "".join(rows) + "</table>"


def _routes(routes: dict[str, dict[str, str]]) -> str:
    """How each gateway of the run carried each dialect's requests (`result.json["routes"]`)."""
    if not routes:
        return ""
    rows = "".join(
        f"<tr><th>{html.escape(gateway)}</th><td>{html.escape(dialect)}</td><td>{html.escape(text)}</td></tr>"
        for gateway, by_dialect in routes.items()
        for dialect, text in by_dialect.items()
    )
    return f'<h2>routes</h2><table class="versions"><tr><th>gateway</th><th>dialect</th><th>route</th></tr>{rows}</table>'


def cell_label(cell: dict[str, Any]) -> str:
    """A grid cell's text: the outcome, the tries the upstream saw and the seconds to the
    client's end, e.g. `error · 3 tries · 41 s` (escaped HTML); `~` when its repeats differ."""
    parts = [html.escape(cell["outcome"]) + ("~" if cell.get("unstable") else "")]
    tries = cell.get("tries")
    if tries is not None:
        parts.append(f"{tries} {'try' if tries == 1 else 'tries'}")
    if cell.get("total_s") is not None:
        parts.append(f"{cell['total_s']:.0f} s")
    return " &middot; ".join(parts)


def _split(cell: dict[str, Any]) -> str:
    """How a repeated cell's repeats split (labs.repeat.split_text), under its word."""
    text = split_text(cell)
    return f'<small class="split">{html.escape(text)}</small>' if text else ""


def _spare(cell: dict[str, Any]) -> str:
    """A note on a cell the spare worker answered (rule 1: a retry before the first token)."""
    return "<small>answered by the spare</small>" if cell.get("answered_by") == "spare" else ""


def _cell_td(cell: dict[str, Any], text: str, extra: tuple[str, ...] = ()) -> str:
    classes = (
        ["cell", cell["outcome"], *extra]
        + (["mismatch"] if cell.get("books_mismatch") else [])
        + (["unstable"] if cell.get("unstable") else [])
    )
    return (
        f'<td class="{" ".join(classes)}" data-id="{html.escape(cell["cell_id"])}" title="{html.escape(cell["why"])}">{text}</td>'
    )


def _changes(result: dict[str, Any], dialect: str = Dialect.CHAT.value) -> str:
    """Per scenario: the baseline's row, then one row per other gateway whose cells show
    `baseline word -> gateway word`, marked better, worse or the same; and a tally per gateway.
    Within one dialect: cells are compared with `direct`'s in the same dialect."""
    cells = {(c["scenario"], c["client"], c["gateway"]): c for c in result["cells"] if dialect_of(c) == dialect}
    others = [g for g in result["gateways"] if g != BASELINE]
    if BASELINE not in result["gateways"] or not others:
        return ""
    clients = [c for c in _clients(result, dialect) if any(k[1] == c for k in cells)]
    tally = {g: dict.fromkeys(Change, 0) for g in others}
    rows = []
    for scenario in result["scenarios"]:
        if dialect_of(scenario) != dialect:
            continue
        name = scenario["name"]
        gateways = [g for g in [BASELINE, *others] if any((name, c, g) in cells for c in clients)]
        if BASELINE not in gateways or len(gateways) < 2:
            continue
        for number, gateway in enumerate(gateways):
            row = ['<tr class="first-of-scenario">' if number == 0 else "<tr>"]
            if number == 0:
                row.append(
                    f'<th class="scenario" rowspan="{len(gateways)}">{html.escape(name)}'
                    f"<small>{html.escape(scenario['title'])}</small></th>"
                )
            upstream = translated_from([c for k, c in cells.items() if k[0] == name and k[2] == gateway])
            label = html.escape(gateway) + (f"<small>from the worker's {html.escape(upstream)}</small>" if upstream else "")
            row.append(f"<th{' class=baseline' if gateway == BASELINE else ''}>{label}</th>")
            for client in clients:
                cell = cells.get((name, client, gateway))
                baseline = cells.get((name, client, BASELINE))
                if cell is None:
                    row.append("<td></td>")
                elif gateway == BASELINE:
                    row.append(_cell_td(cell, html.escape(cell["outcome"]), ("baseline",)))
                elif baseline is None:
                    row.append(_cell_td(cell, html.escape(cell["outcome"])))
                else:
                    how = change(baseline["outcome"], cell["outcome"])
                    tally[gateway][how] += 1
                    text = (
                        html.escape(cell["outcome"])
                        if how is Change.SAME
                        else (f"{html.escape(baseline['outcome'])} &rarr; {html.escape(cell['outcome'])}")
                    )
                    row.append(_cell_td(cell, text + _spare(cell), (how,)))
            row.append("</tr>")
            rows.append("".join(row))
    if not rows:
        return ""
    header = "<tr><th>scenario</th><th>gateway</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in clients) + "</tr>"
    tally_rows = "".join(
        f"<tr><th>{html.escape(g)}</th><td>{t[Change.BETTER]}</td><td>{t[Change.WORSE]}</td><td>{t[Change.SAME]}</td></tr>"
        for g, t in tally.items()
        if sum(t.values())
    )
    return (
        f"<h2>compared with {BASELINE}: what each gateway changed for the clients</h2>"
        f"<p>Each cell: {BASELINE}'s word &rarr; this gateway's, for the same scenario and client "
        f"(a translating gateway's cell, marked with the dialect the worker spoke, against {BASELINE}'s "
        "untranslated one). "
        "&#9650; better (a louder failure beats a quieter one, <code>ok</code> beats all), "
        "&#9660; worse; cells that did not change are faded.</p>"
        '<table class="grid tally"><tr><th>gateway</th><th>better</th><th>worse</th><th>same</th></tr>'
        f"{tally_rows}</table><br>"
        f'<table class="grid changes">{header}{"".join(rows)}</table>'
    )


#: A scorecard word's background (the outcome colours: pass as ok, partial as flagged, safe as
#: error, fail as the worst).
_SCORE_COLOURS = {
    "pass": OUTCOME_COLOURS[Outcome.OK],
    # Rescued, an advisory check failed: the colour of a failure the client was told about.
    "partial": OUTCOME_COLOURS[Outcome.FLAGGED],
    "safe": OUTCOME_COLOURS[Outcome.ERROR],
    "fail": OUTCOME_COLOURS[Outcome.SILENT_TRUNCATION],
    "n/a": ("#eee", "#666"),
}
#: How many evidence cells a scorecard cell lists (result.json and SCORECARD.md keep them all).
_EVIDENCE_SHOWN = 3


def _scorecard(card: dict[str, Any] | None) -> str:
    """The scorecard (labs.scorecard) on top: a row per gateway, a column per rule, each cell its
    word and the first cells of its evidence, each a link that opens that cell; then the gateways'
    versions."""
    if not card:
        return ""
    header = (
        "<tr><th>gateway</th>"
        + "".join(f'<th title="{html.escape(card["questions"][name])}">{html.escape(name)}</th>' for name in card["columns"])
        + "</tr>"
    )
    rows = []
    for gateway, scores in card["gateways"].items():
        row = [f"<tr><th>{html.escape(gateway)}</th>"]
        for name in card["columns"]:
            entry = scores[name]
            background, colour = _SCORE_COLOURS[entry["score"]]
            links = "".join(
                f'<a href="#" class="evidence" data-id="{html.escape(e["cell_id"])}" title="{html.escape(e["why"])}">'
                f"{html.escape(e['scenario'])}/{html.escape(e['dialect'])}/{html.escape(e['client'])}</a>"
                for e in entry["evidence"][:_EVIDENCE_SHOWN]
            )
            more = len(entry["evidence"]) - _EVIDENCE_SHOWN
            links += f"<small>+{more} more</small>" if more > 0 else ""
            row.append(
                f'<td class="score" style="background:{background};color:{colour}" title="{html.escape(entry["why"])}">'
                f"<b>{html.escape(entry['score'])}</b>{links}</td>"
            )
        rows.append("".join(row) + "</tr>")
    versions = ", ".join(f"{html.escape(k)} {html.escape(str(v))}" for k, v in card.get("versions", {}).items())
    return (
        "<h2>scorecard</h2><p>Per gateway: pass, partial (rescued, but an advisory check failed), safe (no rescue, but a "
        "bounded clean error), fail, or n/a (nothing in the run to judge by, or no spare to fail over to). Each cell lists its evidence; click one to open that cell.</p>"
        f'<table class="grid scorecard">{header}{"".join(rows)}</table>'
        + (f"<p>gateway versions: {versions}</p>" if versions else "")
    )


def _scenario_time(timing: dict[str, Any] | None) -> str:
    if not timing or not timing.get("cells"):
        return ""
    return f" <small>({timing['seconds']:.1f} s for {timing['cells']} cells)</small>"


def _time_line(timings: dict[str, Any] | None) -> str:
    """Where the run's time went (labs.progress.Progress.timings), when the run recorded it."""
    if not timings:
        return ""
    in_scenarios = sum(s["seconds"] for s in timings["scenarios"])
    return (
        f"<p>Time: {timings['startup_s']:.0f} s to start the worker, toxiproxy, the gateways and the driver "
        f"hosts; {in_scenarios:.0f} s in the scenarios; {timings.get('between_s', 0):.0f} s between them (the gateways "
        f"of the next topology); {timings['books_s']:.0f} s for the books and shutdown.</p>"
    )


def _not_applicable(result: dict[str, Any], dialect: str) -> str:
    """The gateways of the run the lab does not send `dialect` through: `n/a`, and why."""
    unserved = [n for n in result.get("not_applicable", []) if n["dialect"] == dialect]
    if not unserved:
        return ""
    rows = "".join(f"<tr><th>{html.escape(n['gateway'])}</th><td>n/a</td><td>{html.escape(n['why'])}</td></tr>" for n in unserved)
    return f'<h2>not run in {html.escape(dialect)}</h2><table class="grid"><tr><th>gateway</th><th></th><th>why</th></tr>{rows}</table>'


def _dialect_sections(result: dict[str, Any]) -> list[str]:
    """The comparison and the grids, per dialect (a heading each unless the run is Chat only)."""
    headings = with_headings(result)
    parts = []
    for dialect in dialects_of(result) or [Dialect.CHAT.value]:
        if headings:
            parts.append(f'<h1 class="dialect">dialect: {html.escape(dialect)}</h1>')
        parts.append(_changes(result, dialect))
        parts.append("<h2>the matrix, per gateway</h2>")
        parts += [_grid(result, gateway, dialect) for gateway in result["gateways"]]
        parts.append(_not_applicable(result, dialect))
    return parts


def render_html(result: dict[str, Any]) -> str:
    timings = {s["name"]: s for s in (result.get("timings") or {}).get("scenarios", [])}
    legend = "".join(
        f'<span style="background:{background};color:{text}">{outcome.value}</span>'
        for outcome, (background, text) in OUTCOME_COLOURS.items()
    )
    body = [
        "<h1>finishline lab: what each client saw</h1>",
        f"<p>{len(result['cells'])} cells in {result['duration_s']:.0f} s"
        + (f", each run {result['repeat']} times" if result.get("repeat", 1) > 1 else "")
        + ".</p>",
        _scorecard(result.get("scorecard")),
        f'<p class="legend">{legend}',
        " a trailing ! marks books that disagree with the client. Click a cell for its details.</p>",
        "<h2>versions</h2>",
        f"<p>{html.escape(worker_line(result.get('worker') or {}))}</p>",
        _versions(result.get("versions", {})),
        _routes(result.get("routes", {})),
        "<h2>scenarios</h2><ul>",
        "".join(
            f"<li><b>{html.escape(s.get('label', s['name']))}</b>: {html.escape(s['title'])}"
            f"{' (fault: ' + html.escape(s['fault_summary']) + ')' if s.get('fault_summary') else ''}"
            f"{_scenario_time(timings.get(s.get('label', s['name'])))}</li>"
            for s in result["scenarios"]
        ),
        "</ul>",
        _time_line(result.get("timings")),
        *_dialect_sections(result),
        '<div id="details"></div>',
    ]
    payload = json.dumps(result).replace("</", "<\\/")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>finishline lab</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}"
        f'<script type="application/json" id="lab-data">{payload}</script><script>{_SCRIPT}</script></body></html>'
    )


def write_html(result: dict[str, Any], path: Path) -> None:
    path.write_text(render_html(result), encoding="utf-8")
