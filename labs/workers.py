"""The lab's workers for one run (`--worker`): the simulated worker, or a real server behind its
front (labs.worker.real), with a spare where a topology needs one; and where the truth about their
answers comes from (labs.worker.truth).

- `simulated`: the simulated worker in the lab's process (and a second one as the spare).
- `llama.cpp`: llama.cpp's server, started by the lab (labs.worker.llama_cpp) in its own process
  that dies with the lab, with a slot per cell in flight; the primary and the spare are two fronts
  of that one server (the spare has no tunnel, so it answers in full).
- a URL: the OpenAI-compatible server the user runs there, its model from `--worker-model` or the
  first its `GET /models` lists; two fronts of it, as for llama.cpp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from faults.layout import CapturedLayout
from finishline import Dialect
from labs.dialects import LAB_DIALECTS
from labs.plan import LabConfig
from labs.scenario import Scenario
from labs.topology import AnyWorker
from labs.worker.attempts import PRIMARY, SPARE
from labs.worker.llama_cpp import open_llama_cpp
from labs.worker.real import LLAMA_CPP, SIMULATED, RealUpstream, RealWorker, discover_model, open_real_worker, parse_worker_url
from labs.worker.server import open_worker
from labs.worker.truth import ComputedTruth, WorkerTruth, capture_truth, real_max_tokens

__all__ = [
    "LLAMA_CPP_MAX_SLOTS",
    "REAL_WORKER_DEADLINE_S",
    "REAL_WORKER_IDLE_TIMEOUT_S",
    "for_real_worker",
    "open_lab_workers",
    "prepare_real_workers",
    "worker_truth",
]

#: The most slots the lab gives llama.cpp: each is `n_ctx_per_slot` tokens of KV cache (~23 MB
#: for SmolLM2-135M at 1024), and past this a 135M model on one thread gains nothing from a wider batch.
LLAMA_CPP_MAX_SLOTS = 16
#: The least time a cell gets against a real worker, and finish_fix's idle deadline there. A real
#: server on a CPU keeps its own pace: on the shared 2-core machine, under a load of 11-14, sixteen
#: cells' 10-token answers took 8-11 s to their first byte and gaps of over 2 s between tokens,
#: which the simulated worker's deadlines (15 s a cell, finish_fix's 2 s idle deadline) booked as
#: hangs and stalls. A stall scenario still ends by these: finish_fix's error event, then the cell's deadline.
REAL_WORKER_DEADLINE_S = 60.0
REAL_WORKER_IDLE_TIMEOUT_S = 15.0


@asynccontextmanager
async def open_lab_workers(config: LabConfig, *, spare: bool, slots: int, run_dir: Path) -> AsyncIterator[dict[str, AnyWorker]]:
    """The run's workers by name (`primary`, and `spare` when a topology has two), for the block.

    Args:
        slots: requests a real server started by the lab must serve at once (the most cells of
            one scenario run), capped at `LLAMA_CPP_MAX_SLOTS`.

    Raises:
        labs.worker.llama_cpp.LlamaCppError: llama.cpp did not start.
        labs.worker.real.RealWorkerError: the URL is bad, or its server names no model.
    """
    async with AsyncExitStack() as stack:
        workers: dict[str, AnyWorker] = {}
        if config.worker == SIMULATED:
            workers[PRIMARY] = await stack.enter_async_context(open_worker(name=PRIMARY))
            if spare:
                workers[SPARE] = await stack.enter_async_context(open_worker(name=SPARE, spare=True))
        else:
            upstream = await stack.enter_async_context(_open_upstream(config, slots=slots, run_dir=run_dir))
            for name in (PRIMARY, SPARE) if spare else (PRIMARY,):
                workers[name] = await stack.enter_async_context(open_real_worker(upstream, name=name))
        yield workers


@asynccontextmanager
async def _open_upstream(config: LabConfig, *, slots: int, run_dir: Path) -> AsyncIterator[RealUpstream]:
    if config.worker == LLAMA_CPP:
        n_parallel = max(1, min(slots, LLAMA_CPP_MAX_SLOTS))
        async with open_llama_cpp(n_parallel=n_parallel, log_path=run_dir / "llama.cpp.log") as server:
            yield RealUpstream(host=server.host, port=server.port, path="/v1", model=server.model, facts=server.facts())
        return
    host, port, path = parse_worker_url(config.worker)
    model = config.worker_model
    if model is None:
        model = await trio.to_thread.run_sync(partial(discover_model, config.worker))
    yield RealUpstream(host=host, port=port, path=path, model=model, facts={"worker": config.worker, "model": model})


def for_real_worker(scenario: Scenario) -> Scenario:
    """The scenario as a real worker runs it: its deadline at least `REAL_WORKER_DEADLINE_S`."""
    return dataclasses.replace(scenario, deadline_s=max(scenario.deadline_s, REAL_WORKER_DEADLINE_S))


def prepare_real_workers(workers: dict[str, AnyWorker], scenario: Scenario, truth: WorkerTruth) -> None:
    """Before a scenario run: every real worker's front gives the scenario's output limit, and
    knows where the captured answer's first token ends in each dialect (its attempts' first-token time)."""
    for worker in workers.values():
        if isinstance(worker, RealWorker):
            worker.max_tokens = real_max_tokens(scenario)
            worker.first_token_ends = {}
            for dialect in LAB_DIALECTS:
                try:
                    layout = truth.layout(scenario, dialect)
                except KeyError:  # not captured: no cell of the run has the server speak it
                    continue
                if isinstance(layout, CapturedLayout) and layout.token_events:
                    worker.first_token_ends[dialect] = layout.offset_after_tokens(1)


async def worker_truth(workers: dict[str, AnyWorker], needed: Iterable[tuple[Scenario, Dialect]]) -> WorkerTruth:
    """Where the run's expected answers and fault layouts come from: computed for the simulated
    worker, captured from a real one (labs.worker.truth).

    Raises:
        labs.worker.truth.CaptureError: a real worker's healthy answer could not be captured, or varied.
    """
    primary = workers[PRIMARY]
    if isinstance(primary, RealWorker):
        return await capture_truth(primary, needed)
    return ComputedTruth()
