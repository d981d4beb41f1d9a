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
from pathlib import Path

from labs.grade.card import Card
from labs.grade.gateway_grader import GatewayTarget, GradingLab, grade_with, open_grading_lab
from labs.outcome import BOOKS_NONE

__all__ = ["grade_lab_gateways"]


async def grade_lab_gateways(
    names: tuple[str, ...],
    *,
    clients: tuple[str, ...],
    stall_deadline_s: float,
    results_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Card], dict[str, str]]:
    """({gateway name: its card}, {gateway name: why it could not be graded}), graded one after
    another through one grading lab."""
    from labs.gateways.registry import missing_installs

    missing = missing_installs(names)
    if missing:
        from labs.grade.card import GradeError

        raise GradeError("not installed: " + "; ".join(missing) + " (run make setup)")
    say = progress or (lambda line: None)
    cards: dict[str, Card] = {}
    failures: dict[str, str] = {}
    async with open_grading_lab(upstream_port=0, spare_port=0, clients=clients, results_dir=results_dir) as lab:
        assert lab.spare is not None  # spare_port=0 asks for one
        upstream_port, spare_port = lab.hub.port, lab.spare.port
        for name in names:
            try:
                cards[name] = await _grade_one(lab, name, upstream_port, spare_port, clients, stall_deadline_s, results_dir, say)
            except Exception as error:  # one gateway that does not start must not hide the others
                from labs.entry import error_line

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
) -> Card:
    """Start one lab gateway with the hub (and the spare, if it takes two upstreams), grade it, stop it."""
    from labs.gateways.registry import lookup
    from labs.gateways.services import books_entry, open_gateways, read_books

    entry = lookup(name)
    say(f"{name}: starting")
    spare_url = f"http://127.0.0.1:{spare_port}" if entry.uses_spare else None
    run_dir = lab.run_dir / name.replace("+", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    async with open_gateways(
        (name,), primary_url=f"http://127.0.0.1:{upstream_port}", spare_url=spare_url, run_dir=run_dir
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
            url=gateway.base_url.rstrip("/"),
            upstream_port=upstream_port,
            spare_port=spare_port if entry.uses_spare else None,
            clients=clients,
            books_lookup=books_lookup,
            no_books_reason=no_books,
            stall_deadline_s=stall_deadline_s,
            model=gateway.model_prefix or None,
            api_key=gateway.api_key,
            results_dir=results_dir,
            prepare=gateway.prepare,
            progress=lambda line: say(f"{name}: {line}"),
        )
        card = await grade_with(lab, target)
        card.setup["gateway"] = f"{name}: {entry.summary}"
        return card
