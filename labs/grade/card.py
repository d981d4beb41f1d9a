"""The report card: one line per check (rule, check, mark, evidence), and the exit status it implies.

A card is data; `labs.grade.render` prints it for a terminal, as JSON and as HTML. The marks are a
closed set, and these exact words are what the terminal, the JSON and the HTML show:

- `pass`: the check ran and the target did what the spec (or the post-mortem's rule) asks.
- `fail`: the check ran and the target did not; the evidence says what it did instead.
- `not tested`: the check could not run against this setup (rule 1 without a spare worker, a hub
  policy without the hub), its subject is missing (another check failed), or the model did not do
  what the check needs (a forced tool call answered in prose); never counted as a pass. The
  pytest plugin skips such a check with its evidence as the reason.
- `not checked`: the check needs something the grader cannot see (the gateway's books without
  `--books`); never counted as a pass either.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Card", "CheckResult", "Finding", "GradeError", "Mark", "EXIT_FAILED", "EXIT_PASSED", "EXIT_CANNOT_RUN", "shortened"]

#: Every check that ran passed.
EXIT_PASSED = 0
#: At least one check failed.
EXIT_FAILED = 1
#: The grader could not run (bad arguments, target unreachable): one line says what to fix.
EXIT_CANNOT_RUN = 2


def shortened(text: str | bytes, limit: int) -> str:
    """`text` (bytes are read as UTF-8) cut to at most `limit` characters for an evidence line,
    with `…` where it was cut, so a reader knows there was more."""
    if isinstance(text, bytes):
        text = text[: limit * 4].decode("utf-8", "replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class GradeError(ValueError):
    """The grader cannot run as asked; the message is the one line that says what to fix."""


class Mark(enum.StrEnum):
    """A check's result, in the words the card shows."""

    PASS = "pass"
    FAIL = "fail"
    #: The check needs a part this setup lacks (a spare worker, the hub), a subject another check
    #: found missing, or a model that does what it asks (calls the tool it is told to call).
    NOT_TESTED = "not tested"
    #: The check needs data the grader cannot read (the gateway's books).
    NOT_CHECKED = "not checked"


#: A judge's answer for one check: its mark and the one line of evidence (`CheckResult.evidence`).
Finding = tuple[Mark, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One row of the card."""

    #: The group the check belongs to: `rule 1`, `finish reasons`, `streaming`, ...
    rule: str
    #: The check's id: stable, a pytest test id, the JSON key (e.g. `cut-after-tokens-fin`).
    check: str
    #: What the check asks of the target, in one sentence.
    title: str
    mark: Mark
    #: One line: what was seen. The pytest plugin's failure message is this line.
    evidence: str
    #: Everything behind the evidence (each client's outcome, the raw stream), for JSON and HTML.
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One line, whatever the evidence quotes (an HTML error page, a multi-line message).
        object.__setattr__(self, "evidence", " ".join(self.evidence.split()))

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "check": self.check,
            "title": self.title,
            "mark": str(self.mark),
            "evidence": self.evidence,
            "details": self.details,
        }


@dataclass(slots=True, kw_only=True)
class Card:
    """The card for one target: what was graded, with what, and each check's row."""

    #: `gateway` or `server`.
    kind: str
    #: The base URL graded.
    target: str
    results: list[CheckResult] = field(default_factory=list)
    #: Facts about the run a reader needs (clients and their versions, ports, deadlines).
    setup: dict[str, Any] = field(default_factory=dict)
    #: Checks this card does not run, each with why (a Chat check with no meaning in the dialect
    #: graded): not rows, since they could never pass, and never counted.
    not_run: dict[str, str] = field(default_factory=dict)

    @property
    def exit_status(self) -> int:
        """0 when every check that ran passed, 1 when one failed."""
        return EXIT_FAILED if any(r.mark is Mark.FAIL for r in self.results) else EXIT_PASSED

    def counts(self) -> dict[str, int]:
        """How many checks got each mark, every mark listed."""
        return {str(mark): sum(1 for r in self.results if r.mark is mark) for mark in Mark}

    def result(self, check: str) -> CheckResult:
        """The row of one check, by id.

        Raises:
            KeyError: no such check on this card.
        """
        for row in self.results:
            if row.check == check:
                return row
        raise KeyError(f"no check {check!r} on this card; checks: {', '.join(r.check for r in self.results)}")

    def to_json(self) -> dict[str, Any]:
        record = {
            "kind": self.kind,
            "target": self.target,
            "exit_status": self.exit_status,
            "counts": self.counts(),
            "setup": self.setup,
            "results": [r.to_json() for r in self.results],
        }
        if self.not_run:
            record["not_run"] = dict(self.not_run)
        return record
