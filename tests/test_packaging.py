"""finish_fix works from a checkout with a stock mitmproxy, and its core is standard library only
(and never imports the addon, its adapter to mitmproxy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from faults.child_processes import run_child
from finishline.pytest_plugin import _DIALECTS
from labs.dialects import LAB_DIALECTS
from labs.grade.server_suites import SERVER_SUITES

ROOT = Path(__file__).resolve().parent.parent
#: The script the docs name: `mitmdump -s addons/finish_fix.py` from a checkout.
CHECKOUT_SCRIPT = ROOT / "addons" / "finish_fix.py"

# Runs mitmdump with this checkout taken off sys.path (the venv's editable install puts it there),
# as a mitmproxy installed with pip or pipx would run: only `-s` makes the addon's folder importable.
STOCK_MITMDUMP = f"""
import sys
sys.path[:] = [p for p in sys.path if p.rstrip("/") not in ({str(ROOT)!r}, {str(ROOT / "addons")!r})]
from mitmproxy.tools.main import mitmdump
sys.argv = ["mitmdump", *sys.argv[1:]]
mitmdump()
"""


@pytest.mark.e2e
def test_the_core_imports_only_the_standard_library():
    code = (
        "import sys; sys.path.insert(0, 'addons'); import finishline; "
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'finishline', '__main__'}), "
        "sorted(m for m in sys.modules if m.startswith('finishline.') and not m.startswith('finishline._')))"
    )
    result = run_child([sys.executable, "-I", "-c", code], cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    # Nothing beyond the standard library, and of the package only the core's private modules: not
    # the addon (mitmproxy), the commands or the pytest plugin.
    assert result.stdout.strip() == "[] []"


@pytest.mark.e2e
def test_a_stock_mitmdump_loads_the_addon_from_the_checkout(tmp_path):
    # A bad value is refused by the addon's own `configure`: proof that the script and the package
    # next to it (the core and the addon) were found through -s alone.
    args = [
        "--set",
        f"confdir={tmp_path}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "-s",
        str(CHECKOUT_SCRIPT),
        "--set",
        "finish_fix_on_cut=bogus",
    ]
    result = run_child([sys.executable, "-I", "-c", STOCK_MITMDUMP, *args], cwd=tmp_path, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "finish_fix_on_cut: 'bogus' is not one of error, stop, pass" in output, output
    assert "ModuleNotFoundError" not in output


def test_the_pytest_plugin_offers_the_dialects_the_graders_speak():
    # The plugin spells them itself, since it must not import `labs` (tests/test_wheel.py): the
    # lab's, each of which the server grader has a suite for (Gemini's too).
    assert _DIALECTS == tuple(dialect.value for dialect in LAB_DIALECTS)
    assert _DIALECTS == tuple(dialect.value for dialect in SERVER_SUITES)
