"""The tools from Python: `import kernelscout as ks` is cheap, and its names are the CLI's functions."""

import subprocess
import sys

import pytest

from kernelscout.sandbox.replay import recorded_spaces_dir

SPACE = recorded_spaces_dir() / "pnpoly_RTX_2080_Ti.json.gz"


def test_importing_kernelscout_does_not_load_torch():
    code = "import sys, kernelscout; print('torch' in sys.modules, kernelscout.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False" and out[1]


def test_public_names_are_the_tools_themselves():
    import kernelscout as ks
    from kernelscout.agent.run_view import view_run
    from kernelscout.tools.measure import measure

    assert ks.measure is measure and ks.show is view_run
    assert set(ks.__all__) <= set(dir(ks))
    with pytest.raises(AttributeError, match="no attribute 'mesure'"):
        ks.mesure  # noqa: B018


@pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")
def test_optimize_then_show_from_a_notebook(tmp_path):
    import kernelscout as ks

    result = ks.optimize(space=str(SPACE), budget=12, run_dir=str(tmp_path / "run"), quiet=True)
    view = ks.show(result.run_dir, top=3)
    assert view.budget.used == result.measurements_used == 12
    assert view.best.speedup == pytest.approx(result.best_speedup)
    assert view.status == "finished"
    with pytest.raises(TypeError):
        ks.optimize("a.py", "b.json.gz")  # space is keyword-only: a second positional is refused
