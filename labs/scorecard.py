"""The scorecard: per gateway, whether it follows the post-mortem's rules, read from the matrix.

Theory of operation
-------------------
Each column is a rule and the scenarios that test it (`COLUMNS`, data): the cells of a gateway in
those scenarios (every dialect, every client) are judged one by one by the column's cell rule,
which gives `pass`, `safe` or `fail` and a few words why; the column's word for the gateway is the
worst of its cells (`fail` > `safe` > `pass`), and its evidence the cells that gave that word. A
gateway with no cell in the column's scenarios (the run did not include them, or the gateway does
not serve their dialect) is `n/a`. Under `--repeat`, a cell whose repeats differ
(labs.repeat) is `fail` in every column it counts in, whatever its words: a rule a gateway follows
only sometimes is not followed.

The words:

- `pass`: every cell shows the rule followed (the client got the answer, or was told why not);
- `partial`: the client was rescued, but an advisory check failed (failoverbench's word: a
  fail-over with no backoff before it, a spare that served everything but no circuit opened);
- `safe`: no rescue where one was possible, but every client got a bounded, visible failure (an
  exception, or a finish reason that says the answer is incomplete);
- `fail`: some client carried on with a broken answer, hung, or saw the rule broken (a retried 400,
  a retry before the Retry-After);
- `n/a`: the run has no cell to judge it by, or the column needs a spare the gateway has none of.

The column's word is the worst of its cells, in the order `fail`, `safe`, `partial`, `pass`: an
error where a rescue was possible is worse than a rescue that skipped an advisory check.

The cell rules read the outcome words (labs.outcome.Outcome), the books, and the attempts the
servers recorded (labs.worker.attempts; `tries` on a cell). docs/lab.md
("The scorecard") says the same per column.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labs.gateways.registry import UnknownGateway, lookup
from labs.outcome import BOOKS_ERROR, BOOKS_NONE, BOOKS_OK, Outcome
from labs.repeat import split_text
from labs.scorecard_failover import (
    answered_by_spare,
    backs_off_on_429,
    circuit_opens,
    fails_over_on_503,
    fallback_model_and_usage,
    healthy_afterwards,
    no_prefill_400_after_cut,
    no_retry_of_content_policy,
    tries_words,
)
from labs.scorecard_words import Score, first_gap
from labs.table import dialect_of

__all__ = [
    "COLUMNS",
    "Column",
    "Score",
    "build_scorecard",
    "render_scorecard_markdown",
    "render_scorecard_text",
]


_WORST_FIRST = (Score.FAIL, Score.SAFE, Score.PARTIAL, Score.PASS)

#: A cell rule: a cell of the column's scenarios (result.json's form) and its scenario entry ->
#: its score and a few words why.
CellRule = Callable[[dict[str, Any], dict[str, Any]], "tuple[Score, str]"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    #: The column's name, exactly as the card shows it.
    name: str
    #: What it asks, one line (the card's legend).
    question: str
    #: Which cells it judges: a scenario name -> whether it counts (None: every cell of the gateway).
    scenarios: Callable[[str], bool] | None
    rule: CellRule
    #: Whether a gateway that keeps no per-request books is `n/a` here (the books column).
    needs_books: bool = False
    #: Whether a gateway with no spare configured is `n/a` here (the failover columns).
    needs_spare: bool = False
    #: Judges only the cells that carry a probe (labs.evidence; an agent's cell has none).
    needs_probe: bool = False
    #: Its evidence cells are listed in SCORECARD.md with their attempts' evidence (the conduct
    #: columns, whose rules read the attempts).
    shows_attempts: bool = False


def _by_outcome(words: dict[Outcome, Score]) -> CellRule:
    """A rule that reads the outcome word alone."""

    def rule(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
        outcome = cell["outcome"]
        return words[outcome], outcome.value

    return rule


# Rule 1: a cut during prefill with a healthy spare behind the gateway, passed on by the hub as a
# FIN (the failure is visible before the first token). `ok` is the spare's full answer; an error
# is no rescue but a clean end; anything quieter is a failure a retry could have avoided.
_RULE_1 = _by_outcome(
    {
        Outcome.OK: Score.PASS,
        Outcome.ERROR: Score.SAFE,
        Outcome.FLAGGED: Score.SAFE,
        Outcome.HANG: Score.FAIL,
        Outcome.SILENT_TRUNCATION: Score.FAIL,
    }
)
# Rule 2: after the first token nothing can be retried; every client must be told (raise). A
# finish reason that says "incomplete" is seen only by an application that checks it: `safe`.
_SAY_WHY = _by_outcome(
    {
        Outcome.OK: Score.PASS,
        Outcome.ERROR: Score.PASS,
        Outcome.FLAGGED: Score.SAFE,
        Outcome.HANG: Score.FAIL,
        Outcome.SILENT_TRUNCATION: Score.FAIL,
    }
)
# A stall after tokens: a deadline that counts events must end it with an error.
_STALL = _SAY_WHY

#: Client errors that are the library's own answer to a correct `length`, by design:
#: openai-python's `.stream()` helper raises `LengthFinishReasonError` on any `length` finish
#: (openai/lib/streaming/chat/_completions.py), so a gateway that hands `length` on correctly
#: gets an error there; that is the reason delivered, not lost.
_RAISES_ON_LENGTH_BY_DESIGN = frozenset({"LengthFinishReasonError"})
#: The dialects' words for "the answer was cut by the token limit" (labs.worker.answer.dialect_reason).
_LENGTH_REASONS = frozenset({"length", "max_tokens", "incomplete", "MAX_TOKENS"})
#: Per dialect, the worker's `finish` settings that leave its stream without any sign of its end: a
#: Responses stream without its terminal event, a Gemini stream without a `finishReason` (omitted,
#: or `""`, which counts as none: rule G3). Such a stream reads exactly as a cut one, so a client
#: can only be told the answer may be incomplete, never its reason: an error is the rule followed.
_ENDLESS_WITHOUT_REASON: dict[str, frozenset[str]] = {
    "responses": frozenset({"omitted"}),
    "gemini": frozenset({"omitted", "empty"}),
}


def _raised_on_length_by_design(cell: dict[str, Any], scenario: dict[str, Any]) -> bool:
    """The client raised the way it answers a correct `length` (the reason was delivered)."""
    return (
        cell["outcome"] is Outcome.ERROR
        and cell["report"].get("error_class") in _RAISES_ON_LENGTH_BY_DESIGN
        and scenario["expected"].get("finish_reason") in _LENGTH_REASONS
    )


def _natural_end(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """The worker ended the stream itself (whole answer), with its reason missing, empty or
    right: the client must get the true reason (`ok`). A raise loses the answer but hides
    nothing (`safe`); a made-up or lost reason is a silent truncation (`fail`)."""
    outcome = cell["outcome"]
    if outcome is Outcome.OK:
        return Score.PASS, "ok"
    if _ends_like_a_cut(cell, scenario):
        score, why = _SAY_WHY(cell, scenario)
        return score, f"{why}: without its reason, a {dialect_of(cell)} stream ends like a cut"
    if _raised_on_length_by_design(cell, scenario):
        return Score.PASS, f"error: {cell['report']['error_class']} is the client's answer to `length`"
    if outcome in (Outcome.ERROR, Outcome.FLAGGED):
        return Score.SAFE, outcome.value
    return Score.FAIL, outcome.value


def _ends_like_a_cut(cell: dict[str, Any], scenario: dict[str, Any]) -> bool:
    """The worker's stream in the cell's dialect has no sign of its end (`_ENDLESS_WITHOUT_REASON`)."""
    found = re.search(r"(?:^|;)\s*finish=(\w+)", scenario.get("worker") or "")
    return found is not None and found.group(1) in _ENDLESS_WITHOUT_REASON.get(dialect_of(cell), frozenset())


def _books(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """Rule 3: the books say `error` for every request whose client did not get the answer. Books
    that say `error` for an `ok` cell over-report (`safe`); a failure booked `ok`, or a request the
    books do not know (`no entry`), hides it from an operator (`fail`)."""
    books = cell.get("books")
    # A client that raises on a correct `length` by design got the answer the books say it got.
    failed = cell["outcome"] is not Outcome.OK and not _raised_on_length_by_design(cell, scenario)
    said = f"books {books}{_books_verdict(cell)}"
    if books == BOOKS_ERROR:
        return (Score.PASS, f"{cell['outcome']}, {said}") if failed else (Score.SAFE, f"ok, {said}")
    if books == BOOKS_OK:
        return (Score.FAIL, f"{cell['outcome']}, {said}") if failed else (Score.PASS, f"ok, {said}")
    return Score.FAIL, f"{cell['outcome']}, books {books or 'no entry'}"


def _books_verdict(cell: dict[str, Any]) -> str:
    """The books' own verdict for the cell, where they keep one (finish_fix's ledger: `malformed`,
    `interrupted`, ...), as ` (word)`; "" otherwise."""
    entry = cell.get("books_entry")
    verdict = entry.get("verdict") if isinstance(entry, dict) else None
    return f" ({verdict})" if isinstance(verdict, str) and verdict else ""


def _retry_after_seconds(scenario: dict[str, Any]) -> float:
    """The Retry-After the worker sends in the scenario: its `http_429_retry_after` setting
    (labs.worker.settings), as the scenario entry's worker header names it; 0 when it has none."""
    found = re.search(r"(?:^|;)\s*http_429_retry_after=([0-9.]+)", scenario.get("worker") or "")
    return float(found.group(1)) if found else 0.0


def _retry_after(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A 429 with `Retry-After` once, then healthy: the answer must come (`ok`), from a retry made
    no sooner than the Retry-After after the first attempt (`first_gap_s`). No retry but the 429
    passed on as an error is `safe`; a retry sooner than asked is `fail`."""
    outcome = cell["outcome"]
    if outcome is not Outcome.OK:
        score = Score.SAFE if outcome in (Outcome.ERROR, Outcome.FLAGGED) else Score.FAIL
        return score, f"{outcome.value} after {cell.get('tries') or '?'} tries"
    waited = first_gap(cell)
    if waited is None:
        return Score.PASS, "ok (no second attempt recorded to time the retry)"
    wanted = _retry_after_seconds(scenario)
    # A tenth of a second for the clocks of two processes and a sleep's granularity.
    if waited + 0.1 < wanted:
        return Score.FAIL, f"ok, but retried {waited:.1f} s after the 429, before its Retry-After of {wanted:g} s"
    return Score.PASS, f"ok, retried {waited:.1f} s after the 429 (Retry-After {wanted:g} s)"


def _no_retry_of_400(cell: dict[str, Any], scenario: dict[str, Any]) -> tuple[Score, str]:
    """A 400 `context_length_exceeded` on every attempt: asking again cannot help. One try and an
    error is `pass`; a retry, or the 400 hidden from the client, is `fail`."""
    outcome = cell["outcome"]
    tries = cell.get("tries")
    if outcome in (Outcome.OK, Outcome.SILENT_TRUNCATION, Outcome.HANG):
        return Score.FAIL, f"{outcome.value} after {tries if tries is not None else '?'} tries"
    if tries is not None and tries > 1:
        return Score.FAIL, f"{outcome.value}, but the 400 was sent {tries} times"
    score = Score.PASS if outcome is Outcome.ERROR else Score.SAFE
    return score, f"{outcome.value}, {tries if tries is not None else '?'} try"


def _named(*names: str, prefix: str | None = None) -> Callable[[str], bool]:
    return lambda name: name in names or (prefix is not None and name.startswith(prefix))


#: The card's columns, in order; the names are the issue's, exactly.
COLUMNS: tuple[Column, ...] = (
    Column(
        name="retry-before-first-token",
        question="rule 1: a prefill cut with a spare behind the gateway ends with the spare's answer",
        scenarios=_named("rule1-prefill-cut-hub-abort-spare"),
        rule=_RULE_1,
    ),
    Column(
        name="say-why-after-first-token",
        question="rule 2: a stream cut or failed after tokens makes every client raise, none truncates silently",
        scenarios=_named("error-event-429", "bare-error-frame", "close-after-reasoning", prefix="cut-after-tokens"),
        rule=_SAY_WHY,
    ),
    Column(
        name="books-say-error",
        question="rule 3: the books say error for every request whose client did not get the answer",
        scenarios=None,
        rule=_books,
        needs_books=True,
    ),
    Column(
        name="finish-reason-on-natural-end",
        question="a stream the worker ended itself reaches the client with its true finish reason",
        scenarios=_named("healthy", "reason-omitted", "reason-empty", "length-omitted", "tool-calls-omitted", "stop-reason-null"),
        rule=_natural_end,
    ),
    Column(
        name="stall-ends-in-error",
        question="a stream that stalls after tokens ends in an error before the client's deadline",
        scenarios=_named("stall-after-tokens"),
        rule=_STALL,
    ),
    Column(
        name="retry-after-honoured",
        question="a 429 with Retry-After is retried, no sooner than it asks",
        scenarios=_named("http-429-retry-after"),
        rule=_retry_after,
        shows_attempts=True,
    ),
    Column(
        name="no-retry-of-a-400",
        question="a 400 context_length_exceeded is not retried and reaches the client as an error",
        scenarios=_named("http-400-context-length"),
        rule=_no_retry_of_400,
        shows_attempts=True,
    ),
    Column(
        name="backs-off-on-429",
        question="a 429 on every attempt is met with a backoff (never a tight loop), then a fail-over or a clean error",
        scenarios=_named("http-429-persistent"),
        rule=backs_off_on_429,
        shows_attempts=True,
    ),
    Column(
        name="fails-over-on-503",
        question="a primary that answers 503 on every attempt is failed over to the spare",
        scenarios=_named("http-503-persistent"),
        rule=fails_over_on_503,
        needs_spare=True,
        shows_attempts=True,
    ),
    Column(
        name="no-retry-of-a-content-policy-400",
        question="a 400 content_policy_violation is not retried, and its reason reaches the client",
        scenarios=_named("http-400-content-policy"),
        rule=no_retry_of_content_policy,
        shows_attempts=True,
    ),
    Column(
        name="no-prefill-400-after-cut",
        question="after a cut, the client's final error is never a fallback's prefill 400",
        scenarios=_named("cut-then-prefill-rejected"),
        rule=no_prefill_400_after_cut,
        shows_attempts=True,
    ),
    Column(
        name="circuit-opens",
        question="a flapping primary is skipped while it fails (the spare serves) and used again once it recovers",
        scenarios=_named("flapping-primary"),
        rule=circuit_opens,
        needs_spare=True,
        shows_attempts=True,
    ),
    Column(
        name="fallback-model-and-usage",
        question="a fail-over answer reaches the client with the spare's model name and usage",
        scenarios=_named("fallback-model-usage"),
        rule=fallback_model_and_usage,
        needs_spare=True,
        shows_attempts=True,
    ),
    Column(
        name="healthy-afterwards",
        question="a healthy request through the gateway right after each cell succeeds",
        scenarios=None,
        rule=healthy_afterwards,
        needs_probe=True,
    ),
)


def _has_spare(gateway: str, cells: list[dict[str, Any]]) -> bool:
    """Whether the gateway was given the spare: its registry entry takes one (`uses_spare`), or,
    for a gateway the registry does not know, the spare saw one of its cells."""
    try:
        return lookup(gateway).uses_spare
    except UnknownGateway:
        return any(answered_by_spare(cell) for cell in cells)


def _evidence(cell: dict[str, Any], why: str) -> dict[str, Any]:
    probe = cell.get("probe")
    return {
        "cell_id": cell["cell_id"],
        "scenario": cell["scenario"],
        "dialect": dialect_of(cell),
        "client": cell["client"],
        "outcome": cell["outcome"],
        "why": why,
        # The failover suites' evidence (labs.evidence), where the cell carries it.
        "tries": cell.get("tries"),
        "first_gap_s": cell.get("first_gap_s"),
        "max_attempts_per_s": cell.get("max_attempts_per_s"),
        "probe_ok": probe.get("ok") if isinstance(probe, dict) else None,
    }


def _score_column(
    column: Column, cells: list[dict[str, Any]], scenarios: dict[tuple[str, str], dict[str, Any]]
) -> dict[str, Any]:
    judged = [c for c in cells if column.scenarios is None or column.scenarios(c["scenario"])]
    if column.needs_probe:
        judged = [c for c in judged if c.get("probe")]
        if not judged:
            return {"score": Score.NOT_APPLICABLE.value, "why": "the run has no probe of this gateway", "evidence": []}
    if column.needs_spare and judged and not _has_spare(judged[0]["gateway"], cells):
        return {
            "score": Score.NOT_APPLICABLE.value,
            "why": "the gateway has no spare configured (one upstream only): there is nothing to fail over to",
            "evidence": [],
        }
    if column.needs_books and not any(c.get("books") not in (None, BOOKS_NONE) for c in judged):
        return {"score": Score.NOT_APPLICABLE.value, "why": "the gateway keeps no per-request books", "evidence": []}
    if not judged:
        return {
            "score": Score.NOT_APPLICABLE.value,
            "why": "the run has no cell of this gateway in the column's scenarios",
            "evidence": [],
        }
    by_score: dict[Score, list[dict[str, Any]]] = {score: [] for score in _WORST_FIRST}
    for cell in judged:
        if cell.get("unstable"):
            by_score[Score.FAIL].append(_evidence(cell, f"unstable under --repeat: {split_text(cell)}"))
            continue
        score, why = column.rule(cell, scenarios[(cell["scenario"], dialect_of(cell))])
        by_score[score].append(_evidence(cell, why))
    score = next(s for s in _WORST_FIRST if by_score[s])
    evidence = by_score[score]
    return {"score": score.value, "why": f"{len(evidence)} of {len(judged)} cells: {evidence[0]['why']}", "evidence": evidence}


def build_scorecard(result: dict[str, Any]) -> dict[str, Any]:
    """The card for a lab result (result.json's form): `columns` (names, in order), `questions`
    (name -> what it asks), `gateways` (gateway -> column -> `score`, `why`, `evidence`: the
    cells that gave the score, each with its `cell_id`), and the gateways' `versions`."""
    scenarios = {(s["name"], dialect_of(s)): s for s in result["scenarios"]}
    gateways = {}
    for gateway in result["gateways"]:
        cells = [c for c in result["cells"] if c["gateway"] == gateway]
        gateways[gateway] = {column.name: _score_column(column, cells, scenarios) for column in COLUMNS}
    return {
        "columns": [column.name for column in COLUMNS],
        "questions": {column.name: column.question for column in COLUMNS},
        "gateways": gateways,
        "versions": dict(result.get("versions", {}).get("gateways", {})),
        "worker": dict(result.get("worker") or {"worker": "simulated"}),
    }


def worker_line(facts: dict[str, Any]) -> str:
    """The worker the cells met, in one line (`LabResult.worker`): its name, and for a real one
    its model file (or model) and the versions of xllamacpp and llama.cpp when known."""
    words = [f"worker: {facts.get('worker', 'simulated')}"]
    if facts.get("model_file") or facts.get("model"):
        words.append(f"model {facts.get('model_file') or facts.get('model')}")
    if facts.get("xllamacpp_version"):
        words.append(f"xllamacpp {facts['xllamacpp_version']}")
    if facts.get("llama_cpp_version"):
        words.append(f"llama.cpp {facts['llama_cpp_version']}")
    return ", ".join(words)


def _evidence_line(item: dict[str, Any]) -> str:
    return f"{item['scenario']}/{item['dialect']}/{item['client']}"


def _attempts_note(item: dict[str, Any]) -> str:
    """` [3 tries, first gap 0.52 s, most 2 in 1 s, probe ok]` for an evidence cell that carries
    them (SCORECARD.md), "" for one from before they were kept."""
    if item.get("max_attempts_per_s") is None and item.get("probe_ok") is None:
        return ""
    gap = item.get("first_gap_s")
    parts = [
        tries_words(item.get("tries")),
        "first gap " + (f"{gap:.2f} s" if gap is not None else "none"),
        f"most {item.get('max_attempts_per_s') or 0} in 1 s",
        "probe " + ("none" if item.get("probe_ok") is None else "ok" if item["probe_ok"] else "NOT ok"),
    ]
    return " [" + ", ".join(parts) + "]"


def _first_words(card: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["gateway", *card["columns"]]
    rows = [[gateway, *(scores[name]["score"] for name in card["columns"])] for gateway, scores in card["gateways"].items()]
    return header, rows


def _not_passed(card: dict[str, Any]) -> list[str]:
    """One line per gateway and column that is neither `pass` nor `n/a`: the first cell of its evidence."""
    lines = []
    for gateway, scores in card["gateways"].items():
        for name in card["columns"]:
            entry = scores[name]
            if entry["score"] in (Score.FAIL.value, Score.SAFE.value, Score.PARTIAL.value):
                first = entry["evidence"][0]
                more = f" (+{len(entry['evidence']) - 1} more)" if len(entry["evidence"]) > 1 else ""
                lines.append(f"{gateway} {name} {entry['score']}: {_evidence_line(first)}: {first['why']}{more}")
    return lines


def _versions_line(card: dict[str, Any]) -> str:
    return "gateway versions: " + ", ".join(f"{name} {version}" for name, version in card["versions"].items())


def render_scorecard_text(card: dict[str, Any]) -> str:
    """The card for the terminal: a row per gateway, a column per rule, then why each `fail`
    and `safe` (its first evidence cell), then the gateways' versions."""
    header, rows = _first_words(card)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["scorecard (pass / partial / safe / fail / n/a; docs/lab.md: the scorecard)"]
    lines += ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(2, "-" * len(lines[1]))
    lines += ["", *_not_passed(card)]
    if card["versions"]:
        lines.append(_versions_line(card))
    lines.append(worker_line(card.get("worker") or {}))
    return "\n".join(lines) + "\n"


def render_scorecard_markdown(card: dict[str, Any]) -> str:
    """SCORECARD.md: the same cells as `result.json["scorecard"]`, a Markdown table, then each
    column's question, the evidence of every `fail` and `safe`, and the gateways' versions."""
    header, rows = _first_words(card)
    lines = ["# Scorecard", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "## Columns", ""]
    lines += [f"- `{name}`: {card['questions'][name]}" for name in card["columns"]]
    lines += ["", "## Why not pass", ""]
    lines += [f"- {line}" for line in _not_passed(card)] or ["- every judged cell passed"]
    # The conduct columns' evidence cells, with their attempts' evidence and probe (labs.evidence).
    shown = [column.name for column in COLUMNS if column.shows_attempts and column.name in card["columns"]]
    lines += ["", "## Evidence (conduct columns)", ""]
    for gateway, scores in card["gateways"].items():
        for name in shown:
            for item in scores[name]["evidence"]:
                lines.append(
                    f"- {gateway} {name} {scores[name]['score']}: {_evidence_line(item)} `{item['cell_id']}`: {item['why']}{_attempts_note(item)}"
                )
    if card["versions"]:
        lines += ["", "## Gateway versions", ""]
        lines += [f"- {name}: {version}" for name, version in card["versions"].items()]
    lines += ["", "## Worker", "", f"- {worker_line(card.get('worker') or {}).removeprefix('worker: ')}"]
    return "\n".join(lines) + "\n"
