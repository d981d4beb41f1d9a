"""`python -m labs`: run the chaos lab and print the matrix.

Examples:
    python -m labs                                    # the default run (see --all)
    python -m labs --all                              # every scenario, every client
    python -m labs --dialect messages --dialect responses --gateway direct --gateway finish_fix
    python -m labs --scenario cut-after-tokens-fin --client pi-ai --gateway direct
    python -m labs --repeat 3 --scenario healthy --gateway envoy    # flips show as unstable (`~`)
    python -m labs --gateway external --gateway-url http://127.0.0.1:4000/v1 --tunnel-port 18080
    python -m labs --worker llama.cpp --scenario healthy --gateway direct --gateway finish_fix
    python -m labs --worker http://127.0.0.1:8080/v1 --worker-model my-model --scenario healthy
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from faults.cli_parser import OneLineParser, number_type
from finishline import Dialect
from labs.clients import AGENT_CLIENTS, CLIENTS_BY_DIALECT, DEFAULT_CLIENTS, DEFAULT_CLIENTS_BY_DIALECT, EVERY_CLIENT
from labs.clients.agent_host import agent_refusal
from labs.dialects import LAB_DIALECTS
from labs.entry import EXIT_ERROR, run_command
from labs.fault_plan import FaultPlanError, build_fault
from labs.gateways import EXTERNAL, GATEWAYS
from labs.outcome import Outcome
from labs.plan import LabConfig, run_labels
from labs.progress import Progress
from labs.report_html import write_html
from labs.runner import run_lab
from labs.scenario import SCENARIO_DIR, Scenario, ScenarioError, load_scenario, load_scenarios
from labs.scorecard import build_scorecard, render_scorecard_markdown, render_scorecard_text, worker_line
from labs.table import render_table
from labs.worker.llama_cpp import llama_cpp_missing
from labs.worker.real import (
    LLAMA_CPP,
    REAL_WORKER_DIALECTS,
    SIMULATED,
    RealWorkerError,
    needs_simulated_worker,
    parse_worker_url,
)


class SelectionError(ValueError):
    """What the command line asks for does not fit together (a client or scenario in none of the
    dialects asked for); the message says what each speaks."""


def _at_least_one(whole_number_of: str, that_many: str) -> Callable[[str], float]:
    """An argparse type for a count of 1 or more: 0 cells in flight would leave every cell queued
    and the lab at 0/N forever, 0 repeats would run no cell. The words name what is counted."""
    return number_type(
        whole=True,
        at_least=1,
        not_a_number=lambda text: f"{text!r} is not a whole number of {whole_number_of} (1 or more)",
        out_of_range=lambda text, value: f"{value} {that_many} would run nothing: give 1 or more",
    )


def _worker(text: str) -> str:
    """`--worker`: `simulated`, `llama.cpp`, or an http:// base URL (checked here, in one line)."""
    if text in (SIMULATED, LLAMA_CPP):
        return text
    try:
        parse_worker_url(text)
    except RealWorkerError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not simulated, llama.cpp or an http:// base URL of an OpenAI-compatible server "
            "(e.g. http://127.0.0.1:8080/v1)"
        ) from None
    return text


_jobs = _at_least_one("cells", "cells in flight")
_repeat = _at_least_one("runs per cell", "runs per cell")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m labs",
        description="Run real clients through real gateways against a worker whose tunnel fails on "
        f"purpose, and print what each client saw ({', '.join(o.value for o in Outcome)}).",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help=f"a scenario name from {SCENARIO_DIR} or a path to a .toml file (repeatable; default: "
        "every scenario not marked `default = false`)",
    )
    parser.add_argument(
        "--client",
        action="append",
        choices=EVERY_CLIENT,
        metavar="CLIENT",
        help=f"repeatable; one of {', '.join(EVERY_CLIENT)} (a name is that library or coding agent in each "
        f"dialect it speaks; the agents run in the scenarios that say `agents = true` and in those asked "
        f"for by name); default: Chat's {', '.join(DEFAULT_CLIENTS)}, and every library of the other dialects",
    )
    parser.add_argument(
        "--dialect",
        action="append",
        choices=[d.value for d in LAB_DIALECTS],
        metavar="DIALECT",
        help=f"repeatable; one of {', '.join(d.value for d in LAB_DIALECTS)}; default: all of them, each scenario "
        "in the dialects it lists (the default run: those of its `default_dialects`)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="lift the default run's limits: every scenario in every dialect it lists, and every client "
        "(a --scenario or --client given still picks)",
    )
    parser.add_argument(
        "--gateway",
        action="append",
        choices=(*GATEWAYS, EXTERNAL),
        metavar="GATEWAY",
        help=f"repeatable; default: {', '.join(GATEWAYS)}; `{EXTERNAL}` needs --gateway-url",
    )
    parser.add_argument(
        "--gateway-url", help="base URL of your own gateway (e.g. http://127.0.0.1:4000/v1), run as the `external` gateway"
    )
    parser.add_argument("--gateway-api-key", help="API key the clients send to the external gateway (default: a dummy key)")
    parser.add_argument(
        "--tunnel-port",
        type=int,
        default=0,
        help="fixed 127.0.0.1 port for the worker's tunnel, so your gateway can be pointed at it (default: any free port)",
    )
    # Most of a cell's time is spent waiting (a prefill, a client's retry backoff, a stall until the
    # deadline), not computing: 64 in flight ran the incident and the stall in 46 s and 10 s where 12
    # took 116 s and 26 s, with the same outcome in every cell (measured on 2 cores when the lab had
    # 8 clients and 8 gateways; a run's cells are queued, so more of either only adds to the queue).
    parser.add_argument("--jobs", type=_jobs, default=64, help="cells in flight at once, 1 or more (default 64)")
    parser.add_argument(
        "--repeat",
        type=_repeat,
        default=1,
        metavar="N",
        help="run every cell N times, one repeat after another per scenario; a cell whose outcome or "
        "books differ between repeats is unstable (`~`), and its scorecard column fails (default 1)",
    )
    parser.add_argument(
        "--worker",
        type=_worker,
        default=SIMULATED,
        metavar="WORKER",
        help=f"{SIMULATED} (default: the lab's own, whose settings each scenario sets), {LLAMA_CPP} (llama.cpp's "
        "server with SmolLM2-135M, started by the lab), or the base URL of an OpenAI-compatible server you run "
        "(http://HOST:PORT/v1); a real worker runs the scenarios whose faults the network makes",
    )
    parser.add_argument(
        "--worker-model", metavar="MODEL", help="the model to ask a URL worker for (default: the first its GET /models lists)"
    )
    parser.add_argument("--results", type=Path, default=Path("lab-results"), help="where runs are written (default lab-results/)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def select_scenarios(
    names: list[str] | None,
    everything: bool,
    directory: Path = SCENARIO_DIR,
    dialects: Sequence[Dialect] = LAB_DIALECTS,
) -> list[Scenario]:
    """The scenarios asked for by name (default or not), else every one (`--all`), else the
    default run's: those whose file does not say `default = false`; each narrowed to the
    `dialects` asked for (and, in the default run, to its `default_dialects`). A scenario asked for
    by name runs the coding agents too, as if its file said `agents = true`: the clients asked for
    decide.

    Raises:
        ScenarioError: an unknown name or a bad file.
        SelectionError: a scenario asked for by name runs in none of `dialects`.
    """

    def narrowed(scenario: Scenario, among: tuple[Dialect, ...]) -> Scenario:
        return dataclasses.replace(scenario, dialects=tuple(d for d in among if d in dialects))

    def default_run(scenario: Scenario) -> Scenario:
        # The worker speaks, for a translating gateway, only what the default run takes of the
        # file: else LiteLLM's Gemini bridge (Chat clients) would run every Chat scenario a
        # second time with a Gemini worker, 22 more scenario runs for "a few Gemini rows".
        return dataclasses.replace(
            narrowed(scenario, scenario.default_dialects),
            listed_dialects=tuple(d for d in scenario.listed_dialects if d in scenario.default_dialects),
        )

    if not names:
        every = [narrowed(s, s.dialects) if everything else default_run(s) for s in load_scenarios(directory)]
        return [s for s in every if s.dialects]
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix != ".toml":
            path = directory / f"{name}.toml"
        if not path.exists():
            known = ", ".join(s.name for s in load_scenarios(directory))
            raise ScenarioError(f"no scenario {name!r}; known: {known}")
        scenario = load_scenario(path)
        if not any(d in dialects for d in scenario.dialects):
            raise SelectionError(f"scenario {name!r} runs in {', '.join(scenario.dialects)}, not in {', '.join(dialects)}")
        chosen.append(dataclasses.replace(narrowed(scenario, scenario.dialects), agents=True))
    return chosen


def select_clients(names: list[str] | None, everything: bool, dialects: Sequence[Dialect] = (Dialect.CHAT,)) -> tuple[str, ...]:
    """The clients asked for, else every client of `dialects` (`--all`), else the default run's
    (`DEFAULT_CLIENTS_BY_DIALECT`); in the matrix's fixed order, whatever order they were asked in.

    Raises:
        SelectionError: a client asked for by name speaks none of `dialects`.
    """
    for name in names or ():
        if not any(name in CLIENTS_BY_DIALECT[d] for d in dialects):
            speaks = ", ".join(d.value for d in LAB_DIALECTS if name in CLIENTS_BY_DIALECT[d])
            raise SelectionError(f"client {name!r} speaks {speaks}, not {', '.join(dialects)}")
    by_dialect = CLIENTS_BY_DIALECT if everything else DEFAULT_CLIENTS_BY_DIALECT
    wanted = names or [c for d in dialects for c in by_dialect[d]]
    return tuple(c for c in EVERY_CLIENT if c in wanted)


#: The word for a scenario a real worker cannot run.
NEEDS_SIMULATED = "needs the simulated worker"
#: Why the coding agents do not run against a real worker.
AGENTS_NEED_SIMULATED = (
    "the coding agents need the simulated worker (their requests carry their own system prompt and "
    "tools, which a real model answers otherwise than the lab's captured request)"
)


def split_by_worker(scenarios: list[Scenario], worker: str) -> tuple[list[Scenario], list[dict[str, str]]]:
    """The scenarios a `worker` can run, and those it cannot (each `{"name", "why"}`): a real
    worker runs the scenarios whose faults the network makes; one that needs a knob of the
    simulated worker (a defect in its own stream, a status code, ...) is `n/a` for it."""
    if worker == SIMULATED:
        return scenarios, []
    runnable, left_out = [], []
    for scenario in scenarios:
        knobs = needs_simulated_worker(scenario.worker, faulted=scenario.fault is not None)
        if knobs:
            left_out.append({"name": scenario.name, "why": NEEDS_SIMULATED, "settings": ", ".join(knobs)})
        else:
            runnable.append(scenario)
    return runnable, left_out


def _dialect_note(scenario: Scenario) -> str:
    """The listing's note on where a scenario runs and what the default run takes of it."""
    listed = ", ".join(scenario.dialects)
    if not scenario.default:
        return f"  [{listed}]  (only with --all or --scenario)"
    if scenario.default_dialects == scenario.dialects:
        return f"  [{listed}]"
    return f"  [{listed}; default run: {', '.join(scenario.default_dialects)}]"


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    dialects = tuple(d for d in LAB_DIALECTS if d.value in (arguments.dialect or [d.value for d in LAB_DIALECTS]))
    if arguments.worker != SIMULATED:
        # A real server speaks the dialects its front relays (no Gemini): asked for by name, another
        # is refused in one line; otherwise the run is narrowed to them.
        unspoken = [d for d in dialects if d not in REAL_WORKER_DIALECTS]
        if unspoken and arguments.dialect:
            print(
                f"error: --dialect {unspoken[0].value}: a real worker speaks {', '.join(d.value for d in REAL_WORKER_DIALECTS)} "
                f"(its front relays no {unspoken[0].value} route); leave out --worker {arguments.worker}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        dialects = tuple(d for d in dialects if d in REAL_WORKER_DIALECTS)
    try:
        if arguments.list:
            # Every scenario, with the dialects it lists and what the default run takes of them.
            scenarios = select_scenarios(arguments.scenario, True)
        else:
            scenarios = select_scenarios(arguments.scenario, arguments.all, dialects=dialects)
        clients = select_clients(arguments.client, arguments.all, dialects)
        for scenario in scenarios:
            for dialect in scenario.listed_dialects:
                build_fault(scenario, dialect)  # a bad fault is refused before anything starts
        scenarios, needs_simulated = split_by_worker(scenarios, arguments.worker)
        if arguments.scenario and needs_simulated:
            # Asked for by name: refused, in one line that says why.
            first = needs_simulated[0]
            raise SelectionError(
                f"scenario {first['name']!r} {first['why']} (its worker settings: {first['settings']}); "
                f"it cannot run with --worker {arguments.worker}"
            )
    except (ScenarioError, SelectionError, FaultPlanError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if arguments.worker_model and arguments.worker in (SIMULATED, LLAMA_CPP):
        print(f"error: --worker-model names the model of a URL worker, not of --worker {arguments.worker}", file=sys.stderr)
        return EXIT_ERROR
    asked_agents = [client for client in clients if client in AGENT_CLIENTS]
    if arguments.worker != SIMULATED and asked_agents:
        # A coding agent's request carries its own system prompt and tools, thousands of tokens: a
        # real worker's answer to it is not the captured one (and exceeds SmolLM2's slot context).
        if arguments.client:
            print(f"error: {asked_agents[0]}: {AGENTS_NEED_SIMULATED}; leave out --worker {arguments.worker}", file=sys.stderr)
            return EXIT_ERROR
        clients = tuple(client for client in clients if client not in AGENT_CLIENTS)
        if arguments.all:
            print(f"note: the coding agents are left out: {AGENTS_NEED_SIMULATED}", file=sys.stderr)
    if arguments.all and not arguments.client and not arguments.list:
        # `--all` takes the coding agents where they can run; asked for by name, they must.
        refusal = agent_refusal(clients)
        if refusal is not None:
            clients = tuple(client for client in clients if client not in AGENT_CLIENTS)
            print(f"note: the coding agents are left out: {refusal}", file=sys.stderr)
    if arguments.list:
        width = max((len(scenario.name) for scenario in scenarios), default=0)
        for scenario in scenarios:
            agents = "  (the coding agents too)" if scenario.agents else ""
            print(f"{scenario.name:{width}}  {scenario.title}{_dialect_note(scenario)}{agents}")
        for left_out in needs_simulated:
            print(f"{left_out['name']:{width}}  n/a ({left_out['why']}: {left_out['settings']})")
        return 0
    gateways = tuple(g for g in (*GATEWAYS, EXTERNAL) if g in (arguments.gateway or ()))
    gateways = gateways or tuple(GATEWAYS + ((EXTERNAL,) if arguments.gateway_url else ()))
    if EXTERNAL in gateways and not arguments.gateway_url:
        print("error: the external gateway needs --gateway-url URL", file=sys.stderr)
        return EXIT_ERROR
    config = LabConfig(
        scenarios=tuple(scenarios),
        clients=clients,
        gateways=gateways,
        dialects=dialects,
        jobs=arguments.jobs,
        results_dir=arguments.results,
        external_url=arguments.gateway_url,
        external_api_key=arguments.gateway_api_key,
        tunnel_port=arguments.tunnel_port,
        repeat=arguments.repeat,
        worker=arguments.worker,
        worker_model=arguments.worker_model,
    )
    status = run_and_report(config, needs_simulated)
    if status or not _plain_default_run(argv):
        return status
    return real_server_section(config)


def _plain_default_run(argv: list[str] | None) -> bool:
    """Whether this is `python -m labs` as `make lab` runs it: no option but `--jobs` and `--results`."""
    given = sys.argv[1:] if argv is None else argv
    return all(word.split("=", 1)[0] in _DEFAULT_RUN_OPTIONS for word in given if word.startswith("-"))


#: Options that leave a run the default one (where its results go, how many cells at once).
_DEFAULT_RUN_OPTIONS = ("--jobs", "--results")
#: The default run's real-server section (docs/lab.md "The default run"): llama.cpp, the control
#: row and a cut after tokens that the hub hides, in every dialect it speaks (`REAL_WORKER_DIALECTS`),
#: direct and through finish_fix,
#: with the default clients.
REAL_SERVER_SECTION = ("healthy", "cut-after-tokens-hub-close")
REAL_SERVER_GATEWAYS = ("direct", "finish_fix")


def real_server_section(simulated: LabConfig) -> int:
    """The default run's last part: the same lab against llama.cpp's real server (a short run of its
    own, its results in the folder `real-server/` of the results folder). Left out, with a note,
    when the lab group's llama.cpp is not installed."""
    missing = llama_cpp_missing()
    if missing is not None:
        print(f"\nreal server: left out ({missing})")
        return 0
    print(
        f"\n{'=' * 20}\nreal server: {LLAMA_CPP} (python -m labs --worker {LLAMA_CPP} --gateway direct --gateway finish_fix "
        + " ".join(f"--scenario {name}" for name in REAL_SERVER_SECTION)
        + ")\n"
        + "=" * 20
    )
    dialects = REAL_WORKER_DIALECTS
    config = dataclasses.replace(
        simulated,
        scenarios=tuple(select_scenarios(list(REAL_SERVER_SECTION), False, dialects=dialects)),
        clients=select_clients(None, False, dialects),
        gateways=REAL_SERVER_GATEWAYS,
        dialects=dialects,
        results_dir=simulated.results_dir / "real-server",
        worker=LLAMA_CPP,
    )
    return run_and_report(config, [])


def run_and_report(config: LabConfig, needs_simulated: list[dict[str, str]]) -> int:
    """Run the lab as configured, write its results folder, print the scorecard and the matrix."""
    progress = Progress(run_labels(config), sys.stderr, interactive=sys.stderr.isatty())
    status, result = run_command(run_lab, config, progress)
    progress.finish()
    if status:
        return status
    result.needs_simulated = needs_simulated
    data = result.to_json()
    # Where the time went, for choosing what the default run covers (docs/lab.md "The default run").
    data["timings"] = progress.timings()
    # The verdict per gateway: first in the terminal, on top of the report, and its own file.
    data["scorecard"] = build_scorecard(data)
    run_dir = Path(result.run_dir)
    (run_dir / "result.json").write_text(json.dumps(data, indent=2))
    (run_dir / "SCORECARD.md").write_text(render_scorecard_markdown(data["scorecard"]), encoding="utf-8")
    write_html(data, run_dir / "report.html")
    print(render_scorecard_text(data["scorecard"]))
    print(render_table(data, colour=sys.stdout.isatty()))
    print(worker_line(data["worker"]))
    for left_out in data["needs_simulated"]:
        print(f"{left_out['name']}: n/a ({left_out['why']}: {left_out['settings']})")
    for runtime, versions in sorted(data["versions"].items()):
        print(f"{runtime}: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    # The translating routes the run took (the report lists every gateway's route).
    translated = dict.fromkeys((c["gateway"], c["dialect"]) for c in data["cells"] if c["upstream_dialect"] != c["dialect"])
    for gateway, dialect in translated:
        print(f"route: {gateway} ({dialect}): {data['routes'][gateway][dialect]}")
    print(progress.summary())
    if data["stale_refused"]:
        print(
            "late requests of finished cells refused (409): "
            + ", ".join(f"{server} {count}" for server, count in data["stale_refused"].items())
        )
    print(f"\nresults: {run_dir / 'result.json'}\nreport:  {run_dir / 'report.html'}\nscorecard: {run_dir / 'SCORECARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
