"""The cell id: how the lab numbers a run's cells, and how a model name carries one.

Each cell's requests name a model that starts with its id (`c0007;tokens=3`, labs.scenario), so a
worker's attempts (labs.worker.attempts) and a gateway's books (labs.gateways) find the cell a
request belongs to. Here, below them all, because each of them reads it.
"""

from __future__ import annotations

__all__ = ["CELL_ID_TEMPLATE", "MAX_CELLS", "cell_id_of"]

#: Cell ids are this long (`c` and four digits), so every cell's model name has the same length:
#: the worker echoes the request's model in every chunk, and a byte-exact cut needs every cell of a
#: scenario to get a response of the same length (faults/layout.py: lengths, not content).
CELL_ID_TEMPLATE = "c{:04d}"
#: The most cells one run can number with `CELL_ID_TEMPLATE` (the runner refuses more).
MAX_CELLS = 9999


def cell_id_of(model: object) -> str | None:
    """The cell id in a model name as a gateway or worker saw it (`c0007;tokens=3`, with or
    without a route prefix such as `via-finish-fix/`), or None."""
    if not isinstance(model, str):
        return None
    return model.split(";", 1)[0].rsplit("/", 1)[-1] or None
