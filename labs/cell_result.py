"""One cell's result (`CellResult`): what the runner, the topology's worker records, the repeats'
merge and a cell's requests all fill in or read.

It lives here, below every module that touches it, so that none of them imports the runner
(labs.runner) for it: the runner imports them, never the other way round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from finishline import Dialect
from labs.outcome import Outcome

__all__ = ["CellResult"]


@dataclass(slots=True, kw_only=True)
class CellResult:
    scenario: str
    #: The dialect the client's request spoke.
    dialect: Dialect = Dialect.CHAT
    #: The dialect the worker spoke for it: another than `dialect` when the gateway translated
    #: (its route, `labs.gateways.registry`); None in a result from before there were routes.
    upstream_dialect: Dialect | None = None
    client: str
    gateway: str
    cell_id: str
    outcome: Outcome
    why: str
    report: dict[str, Any]
    request_model: str
    books: str | None = None
    books_entry: dict[str, Any] | None = None
    books_mismatch: bool = False
    #: The stream as finish_fix sent it on, for the finish_fix gateways.
    finish_fix_stream: str | None = None
    #: `tunnel`, `hub`, `tunnel+spare` or `hub+spare` (labs.scenario.Topology.label).
    topology: str = "tunnel"
    #: The worker whose answer the client got: `spare` if the spare saw the request (it is
    #: healthy), else `primary` if the primary did; None: no worker saw it.
    answered_by: str | None = None
    #: How many times each worker was asked for this cell (a gateway's retries show here).
    worker_requests: dict[str, int] = field(default_factory=dict)
    #: What the hub did, one line per request it relayed for this cell (labs.hub.HubExchange).
    hub: list[str] = field(default_factory=list)
    #: Every request the hub and the workers saw for this cell, oldest first
    #: (`labs.worker.attempts.Attempt` as JSON; labs.topology.attach_workers).
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: How many times the gateway (or the client) asked: the requests at the first server behind
    #: the gateway (the hub, else the primary) plus the spare's; None when nothing recorded them.
    tries: int | None = None
    #: Seconds from the client's request to its first token (the client's report), None if none came.
    first_token_s: float | None = None
    #: Seconds from the client's request to its end (the client's report, else the runner's clock).
    total_s: float | None = None
    #: Which repeat of the cell this is (`--repeat`), 1 for the first.
    repeat: int = 1
    #: Every repeat's outcome and books, when the run repeated cells (labs.repeat); else empty.
    repeats: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the repeats differ in outcome or books (labs.repeat.merge_repeats).
    unstable: bool = False
    #: A scenario of several requests per cell (`requests_per_cell`): each request's outcome, why
    #: and seconds, in the order sent; empty for a cell of one request.
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the first attempt to the second (labs.evidence), None with fewer than two.
    first_gap_s: float | None = None
    #: The most attempts within any one second (labs.evidence): hammering shows here.
    max_attempts_per_s: int = 0
    #: The healthy request sent after the cell through the same gateway and client
    #: (labs.evidence.probe_json: `ok`, `outcome`, `why`, `cell_id`, `tries`, `total_s`); None for
    #: an agent's cell.
    probe: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
