"""The lab's HTML report: one self-contained file (no network, no external assets).

The matrix is a colour-coded grid per gateway (scenario rows, client columns), with the outcome
words as cell text; clicking a cell opens its details: why that outcome, the error the client
raised, the text it received, what the gateway's books say, and the worker's stream for that
scenario with the fault that was applied to it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from labs.outcome import Outcome

__all__ = ["render_html", "write_html"]

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table.grid { border-collapse: collapse; }
table.grid th, table.grid td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
table.grid th { background: #f4f4f4; font-weight: 600; }
td.cell { cursor: pointer; font-family: ui-monospace, monospace; white-space: nowrap; }
td.ok { background: #d7f5d7; }
td.error { background: #fde9b8; }
td.hang { background: #e6d3f5; }
td.silent-truncation { background: #d9302c; color: #fff; font-weight: 700; }
td.mismatch::after { content: " !"; font-weight: 700; }
td.cell small { display: block; font-size: 11px; opacity: .75; }
#details { position: fixed; top: 0; right: 0; width: 42%; height: 100%; overflow: auto;
           background: #fff; border-left: 2px solid #888; padding: 1em; display: none; box-sizing: border-box; }
#details pre { white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: .5em; max-height: 22em; overflow: auto; }
#details .close { float: right; cursor: pointer; font-size: 1.3em; }
.legend span { padding: 2px 8px; margin-right: 6px; border: 1px solid #ccc; }
"""

_SCRIPT = """
const data = JSON.parse(document.getElementById('lab-data').textContent);
const cells = Object.fromEntries(data.cells.map(c => [c.cell_id, c]));
const scenarios = Object.fromEntries(data.scenarios.map(s => [s.name, s]));
function esc(t) { return String(t ?? '').replace(/[&<>]/g, ch => ({'&':'&amp;','<':'&lt;','>':'&gt;'}[ch])); }
function show(id) {
  const c = cells[id], s = scenarios[c.scenario], r = c.report;
  const rows = [
    ['outcome', c.outcome], ['why', c.why], ['client', c.client], ['gateway', c.gateway],
    ['completed', r.completed], ['finish reason surfaced', r.finish_reason], ['error', r.error_class ? r.error_class + ': ' + r.error_message : ''],
    ['time to first token', r.ttft_s == null ? '' : r.ttft_s.toFixed(3) + ' s'], ['duration', r.duration_s == null ? '' : r.duration_s.toFixed(3) + ' s'],
    ['HTTP status / Connection', (r.http_status ?? '') + ' / ' + (r.connection ?? '')],
    ['books', (c.books ?? 'no books kept') + (c.books_mismatch ? '  (disagrees with what the client saw!)' : '')],
  ];
  let out = '<span class="close" onclick="hide()">&times;</span><h2>' + esc(c.scenario) + ' / ' + esc(c.client) + ' via ' + esc(c.gateway) + '</h2><table>';
  for (const [k, v] of rows) out += '<tr><th>' + esc(k) + '</th><td>' + esc(v) + '</td></tr>';
  out += '</table><h3>text received (' + r.text.length + ' of ' + s.expected.text.length + ' characters)</h3><pre>' + esc(r.text) + '</pre>';
  if (r.reasoning) out += '<h3>reasoning received</h3><pre>' + esc(r.reasoning) + '</pre>';
  if (r.tool_calls && r.tool_calls.length) out += '<h3>tool calls</h3><pre>' + esc(JSON.stringify(r.tool_calls, null, 1)) + '</pre>';
  out += '<h3>worker\\'s answer</h3><pre>' + esc(s.expected.text) + '  [finish_reason: ' + esc(s.expected.finish_reason) + ']</pre>';
  if (s.expected.http_error) out += '<p>The worker answers HTTP ' + esc(s.expected.http_error) + ' before streaming.</p>';
  if (s.expected.tool_calls && s.expected.tool_calls.length) out += '<h3>worker\\'s tool calls</h3><pre>' + esc(JSON.stringify(s.expected.tool_calls, null, 1)) + '</pre>';
  if (c.books_entry) out += '<h3>books entry</h3><pre>' + esc(JSON.stringify(c.books_entry, null, 1)) + '</pre>';
  if (c.finish_fix_stream != null) out += '<h3>stream as finish_fix sent it on' + (c.gateway === 'finish_fix' ? ' (to the client)' : ' (to LiteLLM)') + '</h3><pre>' + esc(c.finish_fix_stream) + '</pre>';
  out += '<h3>worker\\'s stream</h3><p>fault: ' + esc(s.fault_summary || 'none') + '</p><pre>' + esc(s.worker_stream) + '</pre>';
  out += '<p>request model: <code>' + esc(c.request_model) + '</code></p>';
  const d = document.getElementById('details'); d.innerHTML = out; d.style.display = 'block';
}
function hide() { document.getElementById('details').style.display = 'none'; }
document.querySelectorAll('td.cell').forEach(td => td.addEventListener('click', () => show(td.dataset.id)));
"""


def _grid(result: dict[str, Any], gateway: str) -> str:
    cells = {(c["scenario"], c["client"]): c for c in result["cells"] if c["gateway"] == gateway}
    clients = [c for c in result["clients"] if any(k[1] == c for k in cells)]
    if not clients:
        return ""
    parts = [f"<h2>gateway: {html.escape(gateway)}</h2>", '<table class="grid"><tr><th>scenario</th>']
    parts += [f"<th>{html.escape(c)}</th>" for c in clients]
    parts.append("</tr>")
    for scenario in result["scenarios"]:
        if not any(k[0] == scenario["name"] for k in cells):
            continue
        parts.append(f'<tr><th title="{html.escape(scenario["title"])}">{html.escape(scenario["name"])}</th>')
        for client in clients:
            cell = cells.get((scenario["name"], client))
            if cell is None:
                parts.append("<td></td>")
                continue
            classes = ["cell", cell["outcome"]] + (["mismatch"] if cell.get("books_mismatch") else [])
            books = f"<small>books: {html.escape(cell['books'])}</small>" if cell.get("books") else ""
            parts.append(
                f'<td class="{" ".join(classes)}" data-id="{html.escape(cell["cell_id"])}" '
                f'title="{html.escape(cell["why"])}">{html.escape(cell["outcome"])}{books}</td>'
            )
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


def render_html(result: dict[str, Any]) -> str:
    versions = html.escape(json.dumps(result.get("versions", {})))
    body = [
        "<h1>finishline lab: what each client saw</h1>",
        f"<p>{len(result['cells'])} cells in {result['duration_s']:.0f} s. Versions: <code>{versions}</code></p>",
        '<p class="legend">',
        "".join(
            f'<span style="background:{bg};color:{fg}">{o.value}</span>'
            for o, bg, fg in zip(Outcome, ("#d7f5d7", "#fde9b8", "#e6d3f5", "#d9302c"), ("#222", "#222", "#222", "#fff"))
        ),
        " a trailing ! marks books that disagree with the client. Click a cell for its details.</p>",
        "<h2>scenarios</h2><ul>",
        "".join(
            f"<li><b>{html.escape(s['name'])}</b>: {html.escape(s['title'])}"
            f"{' (fault: ' + html.escape(s['fault_summary']) + ')' if s.get('fault_summary') else ''}</li>"
            for s in result["scenarios"]
        ),
        "</ul>",
        *(_grid(result, gateway) for gateway in result["gateways"]),
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
