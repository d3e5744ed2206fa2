"""A lab's own surrogate and search policy, from a package it installed, chosen by name like the built-in ones.

The package here is a module and a `.dist-info` folder with an `entry_points.txt` on PYTHONPATH: what `pip install`
leaves for a package whose pyproject.toml declares `[project.entry-points."kernelscout.surrogates"]` and
`[project.entry-points."kernelscout.policies"]`. Each search runs `kscout` in a fresh process, as a user would.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelscout.sandbox.replay import recorded_spaces_dir

SPACE = recorded_spaces_dir() / "pnpoly_RTX_3090.json.gz"
pytestmark = pytest.mark.skipif(not SPACE.exists(), reason="recorded spaces (shared/data/benchmark_hub) not found")

PLUGIN = '''
"""A made-up lab model: larger blocks are faster; and a policy that draws configurations at random."""
import math

import numpy as np

from kernelscout.agent.policies.space_search import SpaceProposal
from kernelscout.tools.surrogates.distribution import LogTimeDistribution


class BlockSizeModel:
    name = "block-size"

    def __init__(self, tune_params, *, priors=(), seed=0, valid=None):
        self.params, self.seen = list(tune_params), 0

    def _rows(self, configs):
        return [dict(zip(self.params, r)) for r in configs] if isinstance(configs, np.ndarray) else list(configs)

    def predictive(self, configs):
        mu = [-math.log(1.0 + float(r.get("block_size_x", 1))) for r in self._rows(configs)]
        return LogTimeDistribution(mu=np.array(mu), scale=0.5)

    def p_fail(self, configs):
        return np.zeros(len(configs))

    def update(self, config, measurement):
        self.seen += 1

    def status(self):
        return f"block-size model, {self.seen} measured"


class OneShort(BlockSizeModel):
    def predictive(self, configs):
        dist = super().predictive(configs)
        return None if dist is None else dist.subset(list(range(len(dist) - 1)))


class NoTarget:
    def __init__(self, spec):  # forgets the target
        pass


class SameTwice:
    def __init__(self, spec, target):
        self.space = target.space

    def propose(self, parent, k, rng):
        row = self.space.configs[rng.randrange(len(self.space.configs))]
        return [SpaceProposal(origin="lab-twice", params=dict(zip(self.space.param_names, row)), hypothesis="one draw")] * 2


class RandomDraws:
    def __init__(self, spec, target):
        self.space = target.space

    def propose(self, parent, k, rng):
        rows = rng.sample(range(len(self.space.configs)), k)
        return [SpaceProposal(origin="lab-random", params=dict(zip(self.space.param_names, self.space.configs[i])),
                              hypothesis="a random draw") for i in rows]
'''


def _install(folder: Path, entry_points: str, module: str = PLUGIN) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lab_kscout.py").write_text(module)
    info = folder / "lab_kscout-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-kscout\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


ENTRY_POINTS = """
    [kernelscout.surrogates]
    block-size = lab_kscout:BlockSizeModel
    one-short = lab_kscout:OneShort

    [kernelscout.policies]
    lab-random = lab_kscout:RandomDraws
    no-target = lab_kscout:NoTarget
    same-twice = lab_kscout:SameTwice
"""


def _kscout(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelscout", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_an_installed_surrogate_and_policy_run_a_search_and_its_resume(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS)
    run = tmp_path / "run"
    done = _kscout(["optimize", "--space", str(SPACE), "--budget", "6", "--policy", "lab-random", "--surrogate", "block-size",
                    "--run-dir", str(run), "--json"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["policy"], result["surrogate"], result["measurements_used"]) == ("lab-random", "block-size", 6)
    view = json.loads(_kscout(["show", str(run), "--json"], env, tmp_path).stdout)
    assert view["top"] and {row["origin"] for row in view["top"]} == {"lab-random"}
    # the lab's model forecast (once a reference time was measured to forecast against), and is scored like any other
    from kernelscout.tools.archive import Archive
    from kernelscout.tools.rundir import RunDir

    rationales = [f["forecast"]["rationale"] for f in Archive(RunDir(run, read_only=True)).forecasts()]
    assert rationales[0] == "no reference time measured yet" and rationales[-1].startswith("block-size model, ")
    assert view["forecast_check"]["scored"] > 0

    # a resume goes on with them; without the package it is refused, naming what is missing
    assert _kscout(["budget", str(run), "--set", "8"], env, tmp_path).returncode == 0
    again = _kscout(["resume", str(run), "--json"], env, tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["measurements_used"] == 8, again.stdout + again.stderr
    without = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    refused = _kscout(["resume", str(run)], without, tmp_path)
    assert refused.returncode == 2 and "--policy lab-random: no installed package declares it" in refused.stderr


def test_a_plugin_that_fails_to_import_is_named_before_anything_is_spent(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS, module="import a_module_that_is_not_there\n")
    done = _kscout(["optimize", "--space", str(SPACE), "--budget", "3", "--surrogate", "block-size",
                    "--run-dir", str(tmp_path / "run")], env, tmp_path)
    assert done.returncode == 2
    assert "the surrogate 'block-size' (lab_kscout:BlockSizeModel, from lab-kscout) could not be loaded" in done.stderr
    assert "ModuleNotFoundError" in done.stderr and not (tmp_path / "run").exists()
    # the names are listed where the choices are (an unknown one is refused with them)
    unknown = _kscout(["optimize", "--space", str(SPACE), "--budget", "3", "--policy", "nope"], env, tmp_path)
    assert unknown.returncode == 2 and "lab-random" in unknown.stderr and "tuner" in unknown.stderr


def test_a_plugin_cannot_take_a_built_in_name(tmp_path):
    env = _install(tmp_path / "site", """
        [kernelscout.surrogates]
        learned = lab_kscout:BlockSizeModel
    """)
    code = ("from kernelscout.agent.search_config import surrogate_choices\n"
            "from kernelscout.tools.surrogates import make_surrogate\n"
            "print(surrogate_choices().count('learned'), type(make_surrogate('learned', {'a': [1, 2]})).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "LearnedSurrogate"]
    # a search that chooses the built-in one says that the lab's plugin of that name is not used, and how to choose it
    done = _kscout(["optimize", "--space", str(SPACE), "--budget", "2", "--surrogate", "learned", "--run-dir",
                    str(tmp_path / "run")], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stderr.split())  # as one line, whatever the terminal's width wrapped
    assert ("surrogate: learned is the built-in one; lab-kscout declares a surrogate of that name "
            "(lab_kscout:BlockSizeModel), not used") in said
    assert "give it a name of its own in kernelscout.surrogates to choose it" in said


def test_a_plugin_that_breaks_its_contract_stops_the_search_with_its_name_and_the_run_resumes_once_fixed(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS)
    made = _kscout(["optimize", "--space", str(SPACE), "--budget", "5", "--policy", "no-target", "--run-dir", str(tmp_path / "a"),
                    "--json"], env, tmp_path)
    assert made.returncode == 2 and json.loads(made.stdout)["status"] == "failed"
    assert "the policy 'no-target' (lab_kscout:NoTarget) failed when made: TypeError" in made.stdout
    assert "factory(spec, target)" in made.stdout and "0 of 5 measurements" in made.stdout

    short = _kscout(["optimize", "--space", str(SPACE), "--budget", "12", "--surrogate", "one-short", "--run-dir",
                     str(tmp_path / "b")], env, tmp_path)
    assert short.returncode == 2, short.stdout + short.stderr
    assert "the surrogate 'one-short' returned" in short.stderr and "values from predictive()" in short.stderr
    assert f"continue with: kscout resume {tmp_path / 'b'}" in short.stderr and "Traceback" not in short.stderr


def test_a_child_proposed_twice_in_one_iteration_is_one_candidate(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS)
    done = _kscout(["optimize", "--space", str(SPACE), "--budget", "3", "--policy", "same-twice", "--surrogate", "none",
                    "--run-dir", str(tmp_path / "run")], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "policy: same-twice (lab_kscout:SameTwice, from lab-kscout)" in done.stderr  # whose policy, said at start
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["new"] for e in events if e["event"] == "propose"][0] == 1
    assert [e["considered"] for e in events if e["event"] == "predict"][0] == 1  # forecast once, not twice
