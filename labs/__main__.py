"""`python -m labs`: run the chaos lab and print the matrix.

Examples:
    python -m labs                                    # the default matrix
    python -m labs --scenario cut-after-tokens-fin --client pi-ai --gateway direct
    python -m labs --gateway external --gateway-url http://127.0.0.1:4000/v1 --tunnel-port 18080
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from labs.clients import ALL_CLIENTS
from labs.entry import EXIT_ERROR, run_command
from labs.fault_plan import FaultPlanError, build_fault
from labs.gateways import EXTERNAL, GATEWAYS
from labs.outcome import Outcome
from labs.report_html import write_html
from labs.runner import LabConfig, run_lab
from labs.scenario import SCENARIO_DIR, ScenarioError, load_scenario, load_scenarios
from labs.table import render_table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m labs",
        description="Run real clients through real gateways against a worker whose tunnel fails on "
        f"purpose, and print what each client saw ({', '.join(o.value for o in Outcome)}).",
    )
    parser.add_argument("--scenario", action="append", metavar="NAME",
                        help=f"a scenario name from {SCENARIO_DIR} or a path to a .toml file (repeatable; default: all)")
    parser.add_argument("--client", action="append", choices=ALL_CLIENTS, metavar="CLIENT",
                        help=f"repeatable; default: all of {', '.join(ALL_CLIENTS)}")
    parser.add_argument("--gateway", action="append", choices=(*GATEWAYS, EXTERNAL), metavar="GATEWAY",
                        help=f"repeatable; default: {', '.join(GATEWAYS)}; `{EXTERNAL}` needs --gateway-url")
    parser.add_argument("--gateway-url", help="base URL of your own gateway (e.g. http://127.0.0.1:4000/v1), run as the `external` gateway")
    parser.add_argument("--gateway-api-key", help="API key the clients send to the external gateway (default: a dummy key)")
    parser.add_argument("--tunnel-port", type=int, default=0,
                        help="fixed 127.0.0.1 port for the worker's tunnel, so your gateway can be pointed at it (default: any free port)")
    parser.add_argument("--jobs", type=int, default=12, help="cells in flight at once (default 12)")
    parser.add_argument("--results", type=Path, default=Path("lab-results"), help="where runs are written (default lab-results/)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def _scenarios(names: list[str] | None):
    if not names:
        return load_scenarios()
    chosen = []
    for name in names:
        path = Path(name)
        if path.suffix != ".toml":
            path = SCENARIO_DIR / f"{name}.toml"
        if not path.exists():
            known = ", ".join(s.name for s in load_scenarios())
            raise ScenarioError(f"no scenario {name!r}; known: {known}")
        chosen.append(load_scenario(path))
    return chosen


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        scenarios = _scenarios(arguments.scenario)
        for scenario in scenarios:
            build_fault(scenario)  # a bad fault is refused before anything starts
    except (ScenarioError, FaultPlanError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if arguments.list:
        for scenario in scenarios:
            print(f"{scenario.name:28} {scenario.title}")
        return 0
    gateways = tuple(g for g in (*GATEWAYS, EXTERNAL) if g in (arguments.gateway or ()))
    gateways = gateways or tuple( (GATEWAYS + ((EXTERNAL,) if arguments.gateway_url else ())))
    if EXTERNAL in gateways and not arguments.gateway_url:
        print("error: the external gateway needs --gateway-url URL", file=sys.stderr)
        return EXIT_ERROR
    config = LabConfig(
        scenarios=tuple(scenarios),
        # The matrix shows clients in one fixed order, whatever order they were asked in.
        clients=tuple(c for c in ALL_CLIENTS if c in (arguments.client or ALL_CLIENTS)),
        gateways=gateways,
        jobs=arguments.jobs,
        results_dir=arguments.results,
        external_url=arguments.gateway_url,
        external_api_key=arguments.gateway_api_key,
        tunnel_port=arguments.tunnel_port,
    )
    interactive = sys.stderr.isatty()

    def progress(message: str, done: int, total: int) -> None:
        if interactive:
            sys.stderr.write(f"\r\033[K[{done}/{total}] {message}"[:200])
        elif done == 0 or done == total or done % 25 == 0:
            sys.stderr.write(f"[{done}/{total}] {message}\n")
        sys.stderr.flush()

    status, result = run_command(run_lab, config, progress)
    if interactive:
        sys.stderr.write("\n")
    if status:
        return status
    data = result.to_json()
    run_dir = Path(result.run_dir)
    (run_dir / "result.json").write_text(json.dumps(data, indent=2))
    write_html(data, run_dir / "report.html")
    print(render_table(data, colour=sys.stdout.isatty()))
    for runtime, versions in sorted(data["versions"].items()):
        print(f"{runtime}: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    print(f"\nresults: {run_dir / 'result.json'}\nreport:  {run_dir / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
