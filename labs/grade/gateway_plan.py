"""What `python -m labs.grade gateway` grades, planned before a request is sent: the target and its
options (`GatewayTarget`), the checks a card of its dialect runs and those it lists as not run
(`card_checks`), and each check's request ids (`plan_checks`).

The request ids of every check are planned before the first one runs, so a gateway that must know
its models before it starts (the lab's LiteLLM, for its routes to a Responses upstream) can be told
them (`Plan.models`). A request's model is `[prefix]c0007;<worker settings>;model=finishline-worker`
(`request_model`; labs.grade.gateway_grader says why). Pure: no socket, no process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from finishline import Dialect
from labs.clients import LIBRARY_CLIENTS_BY_DIALECT
from labs.dialects import LAB_DIALECTS
from labs.grade.card import CheckResult, GradeError, Mark
from labs.grade.gateway_checks import BOOKS_CHECK, DEFAULT_GATEWAY_CLIENTS, GATEWAY_CHECK_IDS, GATEWAY_CHECKS, GatewayCheck
from labs.scenario import SCENARIO_DIR, Scenario, load_scenario
from labs.worker.settings import DEFAULT_MODEL_NAME

__all__ = [
    "BYTES_ATTEMPTS",
    "CheckPlan",
    "GatewayTarget",
    "Plan",
    "RequestIds",
    "card_check_ids",
    "card_checks",
    "pinned_scenario",
    "plan_checks",
    "request_model",
    "require_dialect_clients",
]

#: Tries to get the byte-level request of a fault check to the faulty worker, when a gateway that
#: balances load sent it to the spare instead.
BYTES_ATTEMPTS = 3


class RequestIds(Protocol):
    """Where a plan's request ids come from (the grading lab, which also says whether it has a spare)."""

    @property
    def spare(self) -> object | None: ...

    def new_id(self) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayTarget:
    """What to grade and with what."""

    url: str
    upstream_port: int
    spare_port: int | None = None
    clients: tuple[str, ...] = DEFAULT_GATEWAY_CLIENTS
    books_path: Path | None = None
    #: Books read another way (the lab's own gateways): request id -> (word, entry).
    books_lookup: Callable[[str], tuple[str | None, dict[str, Any] | None]] | None = None
    #: How the caller's options are spelled in the card's evidence: `--` for the CLI (`--spare-port`),
    #: `--finishline-` for the pytest plugin (`--finishline-spare-port`).
    option_prefix: str = "--"
    #: Why rule 3 is not checked when there are no books to read (default: no --books given).
    no_books_reason: str | None = None
    stall_deadline_s: float | None = None
    #: A prefix for the model name, for a gateway that routes on one (e.g. `lab/`).
    model: str | None = None
    api_key: str | None = None
    results_dir: Path = Path("lab-results")
    #: Called with one line as each check starts (the CLI prints it to stderr).
    progress: Callable[[str], None] | None = None
    #: Run only these checks (ids); None: every check.
    only: tuple[str, ...] | None = None
    #: Awaited with a check's request models before they are sent, for a gateway that must be told
    #: a model before it routes it (the lab's SMG: `labs.gateways.services.Gateway.prepare`).
    prepare: Callable[[Sequence[str]], Awaitable[None]] | None = None
    #: The dialect the clients speak to the gateway.
    dialect: Dialect = Dialect.CHAT
    #: The dialect the worker speaks behind it: None for the same (a gateway that translates,
    #: such as LiteLLM's Chat bridge, is graded with the worker in the dialect it translates from).
    upstream_dialect: Dialect | None = None

    @property
    def upstream(self) -> Dialect:
        return self.upstream_dialect or self.dialect


def pinned_scenario(scenario: Scenario, check: GatewayCheck) -> Scenario:
    """The scenario as the check runs it: its fault changed, the worker's echoed model pinned."""
    fault = {**scenario.fault, **check.fault_changes} if scenario.fault is not None else None
    worker = dataclasses.replace(scenario.worker, model=DEFAULT_MODEL_NAME)
    return dataclasses.replace(scenario, fault=fault, worker=worker)


def request_model(scenario: Scenario, request_id: str, prefix: str | None) -> str:
    return f"{prefix or ''}{scenario.model_name(request_id)};model={DEFAULT_MODEL_NAME}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckPlan:
    """One check as it will run: its scenario (as the check changes it) and its request ids."""

    check: GatewayCheck
    scenario: Scenario
    client_ids: dict[str, str]
    bytes_ids: tuple[str, ...]

    def models(self, prefix: str | None = None) -> list[str]:
        """Every model name this check's requests will ask for (after `prefix`)."""
        return [request_model(self.scenario, i, prefix) for i in (*self.client_ids.values(), *self.bytes_ids)]


@dataclass(slots=True, kw_only=True)
class Plan:
    """What `grade_with` runs and what the card says without running it."""

    checks: list[CheckPlan]
    #: Checks that get a row without running (`not tested`: a spare is needed and there is none).
    not_tested: list[CheckResult]
    #: Checks the card does not run in this dialect, with why (`Card.not_run`).
    not_run: dict[str, str]

    def models(self, prefix: str | None = None) -> list[str]:
        return [model for plan in self.checks for model in plan.models(prefix)]


def card_checks(dialect: Dialect, upstream: Dialect | None = None) -> tuple[list[GatewayCheck], dict[str, str]]:
    """The checks a card of `dialect` clients and a worker speaking `upstream` (by default the
    same) runs, in card order, and those it lists as not run, with why."""
    upstream = upstream or dialect
    runs, not_run = [], {}
    for check in GATEWAY_CHECKS:
        listed = load_scenario(SCENARIO_DIR / f"{check.scenario}.toml").listed_dialects
        why = check.why_not(dialect, upstream, listed)
        if why is None:
            runs.append(check)
        elif check.dialects is None or dialect in check.dialects or check.other_dialects:
            # (A check of other dialects only, with nothing to say to this one, is not on its card.)
            not_run[check.check] = why
    return runs, not_run


def card_check_ids(dialect: Dialect, upstream: Dialect | None = None) -> tuple[str, ...]:
    """Every row of such a card, in card order (the rule 3 row after rule 2): the pytest plugin's
    tests."""
    ids = {check.check for check in card_checks(dialect, upstream)[0]} | {BOOKS_CHECK[1]}
    return tuple(check for check in GATEWAY_CHECK_IDS if check in ids)


def plan_checks(lab: RequestIds, target: GatewayTarget) -> Plan:
    """The checks `target` runs in its dialects, each with request ids of its own (taken from
    `lab` now, in the order the checks run)."""
    runs, not_run = card_checks(target.dialect, target.upstream)
    plan = Plan(checks=[], not_tested=[], not_run=not_run)
    for check in runs:
        if target.only is not None and check.check not in target.only and check.check != "healthy":
            continue  # the healthy check always runs: it proves the setup reaches the worker
        scenario = pinned_scenario(load_scenario(SCENARIO_DIR / f"{check.scenario}.toml"), check)
        if check.needs_spare and lab.spare is None:
            plan.not_tested.append(
                CheckResult(
                    rule=check.rule,
                    check=check.check,
                    title=check.title_in(target.dialect),
                    mark=Mark.NOT_TESTED,
                    evidence=f"no {target.option_prefix}spare-port: nowhere to retry (give the gateway a second upstream and pass its port)",
                )
            )
            continue
        client_ids = {name: lab.new_id() for name in target.clients}
        bytes_ids = tuple(lab.new_id() for _ in range(BYTES_ATTEMPTS))
        plan.checks.append(CheckPlan(check=check, scenario=scenario, client_ids=client_ids, bytes_ids=bytes_ids))
    return plan


def require_dialect_clients(clients: Sequence[str], dialect: Dialect, option: str) -> None:
    """Every client must be a client library (the graders drive no coding agent) that speaks the
    dialect graded.

    Raises:
        GradeError: one is not; the line names it, the dialects it speaks and those that do.
    """
    for name in clients:
        if name not in LIBRARY_CLIENTS_BY_DIALECT[dialect]:
            speaks = ", ".join(d.value for d in LAB_DIALECTS if name in LIBRARY_CLIENTS_BY_DIALECT[d])
            raise GradeError(
                f"{option} {name}: "
                + (f"speaks {speaks}, not {dialect.value}" if speaks else "not a client library the grader drives")
                + f"; {dialect.value} clients: "
                + ", ".join(LIBRARY_CLIENTS_BY_DIALECT[dialect])
            )
