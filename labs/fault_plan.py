"""A scenario's `[fault]` table, turned into a `faults.catalog.Fault` for the worker's exact bytes.

The table names a builder of `faults.catalog` (`kind`) and its keyword arguments; byte-exact faults
(cuts, stalls) get the worker's computed `ResponsePlan` as their layout, so "after 5 tokens" means
exactly 5 token events for the scenario's settings (`faults/layout.py` explains the two layouts).
The layout is the one of the dialect the cells speak: the same settings give other bytes in
Messages or Responses, so a scenario has one fault per dialect it runs in.
"""

from __future__ import annotations

import inspect
from typing import Any

from faults import catalog
from faults.catalog import FAULT_NAMES, Fault
from faults.layout import ResponseLayout
from finishline import Dialect
from labs.worker.wire import response_plan

__all__ = ["FaultPlanError", "build_fault"]


class FaultPlanError(ValueError):
    """A scenario's fault is unknown or its arguments do not fit the builder."""


def build_fault(scenario: Any, dialect: Dialect = Dialect.CHAT, *, layout: ResponseLayout | None = None) -> Fault | None:
    """The scenario's fault on a stream in `dialect`, or None for a scenario without one; laid out
    on `layout` (a real worker's captured answer, labs.worker.truth), by default on the simulated
    worker's computed plan for the scenario's settings."""
    if scenario.fault is None:
        return None
    arguments = dict(scenario.fault)
    kind = arguments.pop("kind")
    if not isinstance(kind, str) or kind not in FAULT_NAMES:
        raise FaultPlanError(f"{scenario.name}: unknown fault {kind!r}; known: {', '.join(FAULT_NAMES)}")
    builder = getattr(catalog, kind)
    if "layout" in inspect.signature(builder).parameters:
        arguments["layout"] = layout if layout is not None else response_plan(scenario.resolved, dialect=dialect)
    try:
        return builder(**arguments)
    except (TypeError, ValueError) as error:
        # TypeError: arguments that do not fit the builder; ValueError: values it refuses (a cut
        # after more tokens than the stream has).
        raise FaultPlanError(f"{scenario.label(dialect)}: fault {kind}: {error}") from None
