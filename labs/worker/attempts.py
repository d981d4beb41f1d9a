"""Attempt records: every completion request a worker, the spare or the hub saw, by cell id.

A failover suite's log (shared/notes/failover-suites.md): which server a request reached, when the
response head and the first token left it, and how it ended. That is what makes retry conduct
readable: how many attempts a gateway made for one cell, on which worker, and how far apart.

Times are seconds in the server's trio clock (`trio.current_time()`): `arrived_at` when the request
was read whole, `head_s` / `first_token_s` measured from `arrived_at`, None when none went out.
Every server of a lab run lives in one trio run, so their clocks are one clock and records from
several servers sort into one timeline (`attempts_of`).

A record is appended when the request arrives, with `ended = "in_flight"`, and replaced in place
when it ends, so a request that never ends (a gateway holding a `no_response`) is still seen.

The cell id is the lab's: `labs.cell_ids.cell_id_of` on the request's model (the lab puts
it there, `labs.cell_ids.CELL_ID_TEMPLATE`); a model named after the worker itself
(`DEFAULT_MODEL_NAME`, or no model) carries none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.worker.settings import DEFAULT_MODEL_NAME

__all__ = [
    "ENDED_CLIENT_GONE",
    "ENDED_CLOSED",
    "ENDED_COMPLETE",
    "ENDED_IN_FLIGHT",
    "ENDED_NO_RESPONSE",
    "ENDED_REFUSED_STALE",
    "ENDED_RESET",
    "PRIMARY",
    "SPARE",
    "Attempt",
    "AttemptInProgress",
    "HasAttempts",
    "Recorder",
    "attempts_of",
    "http_error_ending",
    "response_ending",
    "request_cell_id",
    "tunnel_ending",
]

#: The two workers of a pool, as their attempts and a cell's `answered_by` name them: the one
#: behind the tunnel, and the spare.
PRIMARY = "primary"
SPARE = "spare"

#: The words of `Attempt.ended` (besides `http_error:<status>` and the hub's `tunnel_<failure>`).
#: The whole response went out (a 2xx; an error status is `http_error:<status>`).
ENDED_COMPLETE = "complete"
#: Writing failed because the client (or the gateway in front) went away.
ENDED_CLIENT_GONE = "client_gone"
#: The server reset the connection before any response head (`reset_before_head`; the real front's server).
ENDED_RESET = "reset"
#: The server closed the connection (a FIN) before any response head (the real worker's front).
ENDED_CLOSED = "closed"
#: The server held the request without answering until the client left (`no_response`).
ENDED_NO_RESPONSE = "no_response"
#: Refused with 409: the cell is not one of the lab's current cells (a late retry of an earlier cell).
ENDED_REFUSED_STALE = "refused_stale"
#: Still going (the record is replaced when it ends).
ENDED_IN_FLIGHT = "in_flight"


def http_error_ending(status: int) -> str:
    """`http_error:<status>`: a complete response with an error status (4xx, 5xx)."""
    return f"http_error:{status}"


def response_ending(status: int) -> str:
    """A whole response's ending by its status: `complete` below 400, else `http_error:<status>`."""
    return ENDED_COMPLETE if status < 400 else http_error_ending(status)


def tunnel_ending(failure: str) -> str:
    """The hub's word when its upstream (the tunnel) failed: `tunnel_fin`, `tunnel_reset`, ..."""
    return f"tunnel_{failure}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One completion request as one server saw it."""

    #: The lab's cell id from the request's model, None when it carries none (`request_cell_id`).
    cell_id: str | None
    #: The server's name: `primary`, `spare` (as the lab names its workers), `hub`.
    server: str
    #: The completion route's dialect; None when the path named none (the hub relays any path).
    dialect: Dialect | None
    #: The server's trio clock when the request had been read.
    arrived_at: float
    #: Seconds from arrival until the response head was written, None when none was.
    head_s: float | None
    #: Seconds from arrival until the first token event was written (a non-streaming 200 body: the
    #: body), None when none was.
    first_token_s: float | None
    #: How it ended: the `ENDED_*` words, `http_error:<status>`, or the hub's `tunnel_<failure>`.
    ended: str
    #: The status sent (the hub: relayed, or its own 409 / 502), None when no head went out.
    status: int | None


class HasAttempts(Protocol):
    """A running worker (`labs.worker.server.RunningWorker`) or hub (`labs.hub.Hub`)."""

    attempts: list[Attempt]


class Recorder(HasAttempts, Protocol):
    """A server that records attempts under its name."""

    name: str


@dataclass(slots=True)
class AttemptInProgress:
    """One attempt while it runs: its slot in the server's `attempts` (filled `in_flight` when it
    opens) and the moments the server notes; `close` writes the final record into the slot."""

    index: int
    cell_id: str | None
    dialect: Dialect | None
    arrived_at: float
    head_at: float | None = None
    first_token_at: float | None = None

    @classmethod
    def open(cls, server: Recorder, cell_id: str | None, dialect: Dialect | None, arrived_at: float) -> AttemptInProgress:
        """Start the record of a request that arrived at `arrived_at` (the server's trio clock)."""
        record = cls(len(server.attempts), cell_id, dialect, arrived_at)
        server.attempts.append(record.attempt(server.name, ENDED_IN_FLIGHT, None))
        return record

    def note_head(self, now: float) -> None:
        self.head_at = now

    def note_first_token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now

    def attempt(self, server: str, ended: str, status: int | None) -> Attempt:
        """The record as of now, with `ended` and `status`."""

        def since(moment: float | None) -> float | None:
            return None if moment is None else moment - self.arrived_at

        return Attempt(
            cell_id=self.cell_id,
            server=server,
            dialect=self.dialect,
            arrived_at=self.arrived_at,
            head_s=since(self.head_at),
            first_token_s=since(self.first_token_at),
            ended=ended,
            status=status,
        )

    def close(self, server: Recorder, ended: str, status: int | None) -> None:
        """The attempt ended: replace its `in_flight` record."""
        server.attempts[self.index] = self.attempt(server.name, ended, status)


def request_cell_id(model: object) -> str | None:
    """The cell id of a request whose body names `model`: `cell_id_of(model)`, except that the
    worker's own name (`finishline-worker;tokens=3`, what a test without the lab sends) is none."""
    cell = cell_id_of(model)
    return None if cell == DEFAULT_MODEL_NAME else cell


def attempts_of(cell_id: str | None, *servers: HasAttempts | Iterable[Attempt]) -> list[Attempt]:
    """Every attempt for `cell_id` that the given servers (or lists of attempts) recorded, in order
    of arrival (ties: in the order the servers are given)."""
    found: list[Attempt] = []
    for server in servers:
        records = server.attempts if hasattr(server, "attempts") else server
        found += [attempt for attempt in records if attempt.cell_id == cell_id]
    return sorted(found, key=lambda attempt: attempt.arrived_at)
