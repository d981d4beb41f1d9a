"""`python -m labs`: run the chaos lab and print the matrix.

Examples:
    python -m labs                                    # the default run (see --all)
    python -m labs --all                              # every scenario, every client
    python -m labs --scenario cut-after-tokens-fin --client pi-ai --gateway direct
    python -m labs --gateway external --gateway-url http://127.0.0.1:4000/v1 --tunnel-port 18080
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from faults.cli_parser import OneLineParser
from labs.clients import ALL_CLIENTS, DEFAULT_CLIENTS
from labs.entry import EXIT_ERROR, run_command
from labs.fault_plan import FaultPlanError, build_fault
from labs.gateways import EXTERNAL, GATEWAYS
from labs.outcome import Outcome
from labs.progress import Progress
from labs.report_html import write_html
from labs.runner import LabConfig, run_lab
from labs.scenario import SCENARIO_DIR, ScenarioError, load_scenario, load_scenarios
from labs.table import render_table


def _jobs(text: str) -> int:
    # 0 in flight would leave every cell queued and the lab at 0/N forever.
    try:
        jobs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of cells (1 or more)") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"{jobs} cells in flight would run nothing: give 1 or more")
    return jobs


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m labs",
        description="Run real clients through real gateways against a worker whose tunnel fails on "
        f"purpose, and print what each client saw ({', '.join(o.value for o in Outcome)}).",
    )
    parser.add_argument("--scenario", action="append", metavar="NAME",
                        help=f"a scenario name from {SCENARIO_DIR} or a path to a .toml file (repeatable; default: "
                        "every scenario not marked `default = false`)")
    parser.add_argument("--client", action="append", choices=ALL_CLIENTS, metavar="CLIENT",
                        help=f"repeatable; one of {', '.join(ALL_CLIENTS)}; default: {', '.join(DEFAULT_CLIENTS)}")
    parser.add_argument("--all", action="store_true",
                        help="lift the default run's limits: every scenario and every client (a --scenario or "
                        "--client given still picks)")
    parser.add_argument("--gateway", action="append", choices=(*GATEWAYS, EXTERNAL), metavar="GATEWAY",
                        help=f"repeatable; default: {', '.join(GATEWAYS)}; `{EXTERNAL}` needs --gateway-url")
    parser.add_argument("--gateway-url", help="base URL of your own gateway (e.g. http://127.0.0.1:4000/v1), run as the `external` gateway")
    parser.add_argument("--gateway-api-key", help="API key the clients send to the external gateway (default: a dummy key)")
    parser.add_argument("--tunnel-port", type=int, default=0,
                        help="fixed 127.0.0.1 port for the worker's tunnel, so your gateway can be pointed at it (default: any free port)")
    # Most of a cell's time is spent waiting (a prefill, a client's retry backoff, a stall until the
    # deadline), not computing: 64 in flight ran the incident and the stall in 46 s and 10 s where 12
    # took 116 s and 26 s, with the same outcome in every cell (measured on 2 cores when the lab had
    # 8 clients and 8 gateways; a run's cells are queued, so more of either only adds to the queue).
    parser.add_argument("--jobs", type=_jobs, default=64, help="cells in flight at once, 1 or more (default 64)")
    parser.add_argument("--results", type=Path, default=Path("lab-results"), help="where runs are written (default lab-results/)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def select_scenarios(names: list[str] | None, everything: bool, directory: Path = SCENARIO_DIR):
    """The scenarios asked for by name (default or not), else every one (`--all`), else the
    default run's: those whose file does not say `default = false`."""
    if not names:
        return [s for s in load_scenarios(directory) if everything or s.default]
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix != ".toml":
            path = directory / f"{name}.toml"
        if not path.exists():
            known = ", ".join(s.name for s in load_scenarios(directory))
            raise ScenarioError(f"no scenario {name!r}; known: {known}")
        chosen.append(load_scenario(path))
    return chosen


def select_clients(names: list[str] | None, everything: bool) -> tuple[str, ...]:
    """The clients asked for, else every one (`--all`), else the default run's; in the matrix's
    fixed order, whatever order they were asked in."""
    wanted = names or (ALL_CLIENTS if everything else DEFAULT_CLIENTS)
    return tuple(c for c in ALL_CLIENTS if c in wanted)


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        scenarios = select_scenarios(arguments.scenario, arguments.all or arguments.list)
        for scenario in scenarios:
            build_fault(scenario)  # a bad fault is refused before anything starts
    except (ScenarioError, FaultPlanError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if arguments.list:
        width = max((len(scenario.name) for scenario in scenarios), default=0)
        for scenario in scenarios:
            print(f"{scenario.name:{width}}  {scenario.title}" + ("" if scenario.default else "  (only with --all or --scenario)"))
        return 0
    gateways = tuple(g for g in (*GATEWAYS, EXTERNAL) if g in (arguments.gateway or ()))
    gateways = gateways or tuple( (GATEWAYS + ((EXTERNAL,) if arguments.gateway_url else ())))
    if EXTERNAL in gateways and not arguments.gateway_url:
        print("error: the external gateway needs --gateway-url URL", file=sys.stderr)
        return EXIT_ERROR
    config = LabConfig(
        scenarios=tuple(scenarios),
        clients=select_clients(arguments.client, arguments.all),
        gateways=gateways,
        jobs=arguments.jobs,
        results_dir=arguments.results,
        external_url=arguments.gateway_url,
        external_api_key=arguments.gateway_api_key,
        tunnel_port=arguments.tunnel_port,
    )
    progress = Progress([s.name for s in scenarios], sys.stderr, interactive=sys.stderr.isatty())
    status, result = run_command(run_lab, config, progress)
    progress.finish()
    if status:
        return status
    data = result.to_json()
    # Where the time went, for choosing what the default run covers (README: "the default run").
    data["timings"] = progress.timings()
    run_dir = Path(result.run_dir)
    (run_dir / "result.json").write_text(json.dumps(data, indent=2))
    write_html(data, run_dir / "report.html")
    print(render_table(data, colour=sys.stdout.isatty()))
    for runtime, versions in sorted(data["versions"].items()):
        print(f"{runtime}: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    print(progress.summary())
    print(f"\nresults: {run_dir / 'result.json'}\nreport:  {run_dir / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
