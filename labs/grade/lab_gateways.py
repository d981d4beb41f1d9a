"""`python -m labs.grade lab-gateways`: grade every gateway the lab ships, for the table in docs/grading.md.

One grading lab (worker, tunnel, hub, spare worker, driver hosts) serves every gateway in turn:
each gateway is started by the lab's own registry (`labs.gateways`), configured with the hub as its
upstream and, where it can have two, the spare as its second, graded, and stopped. Its books are
read the way the lab reads them (finish_fix's ledger, LiteLLM's callbacks, Envoy's access log,
...). The cards go side by side into one Markdown table: checks as rows, gateways as columns.

The lab holds both ends here, so the hub and the spare listen on port 0 and each gateway is given
the ports they got: no port is picked first and bound later (no race with another program).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finishline import Dialect
from labs.entry import error_line
from labs.gateways.registry import lookup, missing_installs
from labs.gateways.services import books_entry, open_gateways, read_books
from labs.grade.card import Card, GradeError
from labs.grade.gateway_grader import GradingLab, grade_with, open_grading_lab
from labs.grade.gateway_plan import GatewayTarget, plan_checks, require_dialect_clients
from labs.outcome import BOOKS_NONE

__all__ = ["grade_lab_gateways"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Routes:
    """The dialect the clients speak, and the one the worker speaks behind every gateway graded."""

    dialect: Dialect
    upstream: Dialect


async def grade_lab_gateways(
    names: tuple[str, ...],
    *,
    clients: tuple[str, ...],
    stall_deadline_s: float,
    results_dir: Path,
    progress: Callable[[str], None] | None = None,
    dialect: Dialect = Dialect.CHAT,
    upstream_dialect: Dialect | None = None,
) -> tuple[dict[str, Card], dict[str, str]]:
    """({gateway name: its card}, {gateway name: why it could not be graded}), graded one after
    another through one grading lab, with `dialect` clients and the worker speaking
    `upstream_dialect` (by default the same)."""
    missing = missing_installs(names)
    if missing:
        raise GradeError("not installed: " + "; ".join(missing) + " (run make setup)")
    require_dialect_clients(clients, dialect, "--client")
    routes = Routes(dialect=dialect, upstream=upstream_dialect or dialect)
    say = progress or (lambda line: None)
    cards: dict[str, Card] = {}
    failures: dict[str, str] = {}
    async with open_grading_lab(upstream_port=0, spare_port=0, clients=clients, results_dir=results_dir, dialect=dialect) as lab:
        assert lab.spare is not None  # spare_port=0 asks for one
        upstream_port, spare_port = lab.hub.port, lab.spare.port
        for name in names:
            try:
                cards[name] = await _grade_one(
                    lab, name, upstream_port, spare_port, clients, stall_deadline_s, results_dir, say, routes
                )
            except Exception as error:  # one gateway that does not start must not hide the others
                failures[name] = error_line(error).removeprefix("error: ")
                say(f"{name}: could not be graded: {failures[name]}")
    return cards, failures


async def _grade_one(
    lab: GradingLab,
    name: str,
    upstream_port: int,
    spare_port: int,
    clients: tuple[str, ...],
    stall_deadline_s: float,
    results_dir: Path,
    say: Callable[[str], None],
    routes: Routes,
) -> Card:
    """Start one lab gateway with the hub (and the spare, if it takes two upstreams), grade it, stop it."""
    entry = lookup(name)
    say(f"{name}: starting")
    spare_url = f"http://127.0.0.1:{spare_port}" if entry.uses_spare else None
    run_dir = lab.run_dir / name.replace("+", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    # The checks' request ids first: a gateway configured with every model before it starts (the
    # lab's LiteLLM, for its routes to a Responses upstream) is told them (without its prefixes).
    shape = GatewayTarget(
        url="",
        upstream_port=upstream_port,
        spare_port=spare_port if entry.uses_spare else None,
        clients=clients,
        dialect=routes.dialect,
        upstream_dialect=routes.upstream,
    )
    plan = plan_checks(lab, shape)
    async with open_gateways(
        (name,),
        primary_url=f"http://127.0.0.1:{upstream_port}",
        spare_url=spare_url,
        run_dir=run_dir,
        models={(name, routes.dialect): tuple(plan.models())},
    ) as gateways:
        gateway = gateways[name]
        books_lookup, no_books = None, None
        if gateway.books_kind is None:
            no_books = "no gateway in between, no books"
        elif gateway.books_kind == BOOKS_NONE:
            no_books = f"{name} keeps no per-request books"
        else:

            def books_lookup(request_id: str) -> tuple[str | None, dict | None]:
                return books_entry(gateway, read_books(gateway.books_path), request_id)

        target = GatewayTarget(
            url=gateway.base_url_for(routes.dialect).rstrip("/"),
            upstream_port=upstream_port,
            spare_port=spare_port if entry.uses_spare else None,
            clients=clients,
            books_lookup=books_lookup,
            no_books_reason=no_books,
            stall_deadline_s=stall_deadline_s,
            model=gateway.model_for(routes.dialect, "") or None,
            dialect=routes.dialect,
            upstream_dialect=routes.upstream,
            api_key=gateway.api_key,
            results_dir=results_dir,
            prepare=gateway.prepare,
            progress=lambda line: say(f"{name}: {line}"),
        )
        card = await grade_with(lab, target, plan)
        card.setup["gateway"] = f"{name}: {entry.route_text(routes.dialect)}"
        return card
