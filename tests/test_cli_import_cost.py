"""Commands that only read (`kscout --help`, `show`, `budget`) answer in about half a second: they never import
scikit-learn, scipy.stats, LangGraph or torch, which together take two seconds or more to load."""

import json
import subprocess
import sys

import pytest

from kernelscout.agent.runner import start_search
from kernelscout.sandbox.replay import recorded_spaces_dir

SPACE = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
HEAVY = ("sklearn", "scipy.stats", "langgraph", "torch")

# Runs the CLI in a fresh interpreter and reports, as it exits, which heavy modules were loaded.
PROBE = """
import atexit, json, sys
atexit.register(lambda: print("LOADED " + json.dumps([m for m in {heavy!r} if m in sys.modules])))
sys.argv = ["kscout", *{args!r}]
from kernelscout.agent.entry import main
main()
"""


def _heavy_modules_loaded(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, args=list(args))], capture_output=True, text=True,
                          timeout=120)
    line = next((x for x in done.stdout.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, done.stdout + done.stderr
    return json.loads(line[len("LOADED "):])


def test_help_loads_nothing_heavy():
    assert _heavy_modules_loaded("--help") == []


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_reading_a_finished_search_loads_nothing_heavy(tmp_path):
    run = tmp_path / "run"
    start_search(problem=None, space=str(SPACE), budget=12, run_dir=str(run), quiet=True, seed=1)  # forecasts to score
    assert _heavy_modules_loaded("show", str(run)) == []
    assert _heavy_modules_loaded("show", str(run), "--json") == []
    assert _heavy_modules_loaded("budget", str(run)) == []


def test_a_searching_command_loads_the_heavy_modules_while_a_stop_is_held_back():
    """A Ctrl-C inside a C extension's import kills the process instead of ending it quietly (tests/test_headless_run.py),
    so what a search imports is loaded by the entry point, where a stop waits, and not first inside the search."""
    code = ("import sys\nfrom kernelscout.agent.entry import _modules_for, load_holding_stops\n"
            "load_holding_stops(_modules_for(['kscout', 'run', 'examples/softmax']))\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[0] == str(sorted(HEAVY)), done.stdout + done.stderr
