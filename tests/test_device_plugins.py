"""A lab's own device, from a package it installed, chosen by name: `--device lab-box`.

The lab's plugin ships each job to `kscout slot` on the machine that measures (here a subprocess of this one, standing
in for `ssh gpu-box kscout slot --device cuda`) and hands back the result. The budget stays in the agent's ledger.
The package is installed as in tests/test_plugins.py: a module and a `.dist-info` folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from test_plugins import _install, _kscout

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

DEVICE_PLUGIN = '''
"""A made-up lab's device: each job goes to `kscout slot` on "the lab's machine" (here, a subprocess of this one)."""
import subprocess
import sys

from kernelscout.sandbox.slot import SlotResult, WorkerLost


class LabBox:
    device = "cpu"  # what the lab's machine measures on
    gpu = None  # no GPU: no speed-of-light bound

    def __init__(self, workers=None):
        self.names = [f"lab-{i}" for i in range(workers or 1)]

    def call(self, index, job):
        done = subprocess.run([sys.executable, "-m", "kernelscout", "slot", "--device", "cpu"], input=job.model_dump_json(),
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise WorkerLost(done.stderr[-300:])
        return done.stdout  # the JSON `kscout slot` prints, which kscout reads back as a SlotResult

    def recover(self, index):
        return True

    def describe(self):
        return f"{len(self.names)} worker(s) on the lab's box"

    def close(self):
        pass


class Broken(LabBox):
    def call(self, index, job):
        raise RuntimeError("the lab's queue is down")


class NoKind(LabBox):
    device = None


class Unplugged(LabBox):
    """The lab's box is off: every job is lost. Without `recover`, a lost worker is gone for good."""

    def call(self, index, job):
        raise WorkerLost("connection refused")

    recover = None


class Flapping(Unplugged):
    """The same, with a `recover` that always says the worker is back."""

    def recover(self, index):
        return True
'''

ENTRY_POINTS = """
    [kernelscout.devices]
    lab-box = lab_kscout:LabBox
    lab-broken = lab_kscout:Broken
    lab-nokind = lab_kscout:NoKind
    lab-off = lab_kscout:Unplugged
    lab-flapping = lab_kscout:Flapping
"""


def _measurements(run: Path) -> list[tuple[str, dict]]:
    rows = sqlite3.connect(run / "run.db").execute("SELECT device, result_json FROM measurements ORDER BY id").fetchall()
    return [(device, json.loads(result)) for device, result in rows]


def test_a_search_measures_on_an_installed_device_and_resumes_only_with_it(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS, module=DEVICE_PLUGIN)
    run = tmp_path / "run"
    done = _kscout(["optimize", str(EXAMPLES / "softmax"), "--device", "lab-box", "--budget", "2", "--confirm", "0",
                    "--run-dir", str(run), "--json"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["measurements_used"] == 2
    measured = _measurements(run)  # two, or three where a busy machine voided a timing and it was taken again
    assert len(measured) >= 2 and all(device == m["device"] == "lab-box" for device, m in measured)
    # each ran in the sandbox of the process `kscout slot` started, not in this search's own workers
    assert all(any(c.startswith("measured on slot@") for c in m["checks"]) for _, m in measured)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["backend"] for e in events if e["event"] == "workers"] == ["device lab-box (cpu): 1 worker(s) on the lab's box"]
    assert any(e["event"] == "sol_unavailable" and "names no GPU" in e["reason"] for e in events)

    without = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    assert _kscout(["budget", str(run), "--set", "3"], without, tmp_path).returncode == 0
    refused = _kscout(["resume", str(run)], without, tmp_path)
    assert refused.returncode == 2 and "--device lab-box: no installed package declares it" in refused.stderr
    assert len(_measurements(run)) == len(measured)  # nothing was spent by the refusal


def test_kscout_measure_on_an_installed_device_and_what_a_broken_one_costs(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS, module=DEVICE_PLUGIN)
    problem, candidate = str(EXAMPLES / "softmax" / "problem.py"), str(EXAMPLES / "softmax" / "fast.py")

    ok = _kscout(["measure", problem, candidate, "--device", "lab-box", "--run-dir", str(tmp_path / "a"), "--json"], env, tmp_path)
    m = json.loads(ok.stdout)
    assert ok.returncode == 0 and m["status"] == "ok" and m["correct"] and m["charged"], ok.stdout + ok.stderr
    assert m["device"] == "lab-box" and any(c.startswith("measured on slot@") for c in m["checks"])
    assert [d for d, _ in _measurements(tmp_path / "a")] == ["lab-box"]  # the ledger keys it under the same name

    # a device that fails once it has the job: charged, since the job may have run there, and the message says whose
    broken = _kscout(["measure", problem, candidate, "--device", "lab-broken", "--run-dir", str(tmp_path / "b"), "--json"], env,
                     tmp_path)
    m = json.loads(broken.stdout)
    assert m["status"] == "crashed" and m["charged"]
    assert "the device 'lab-broken' failed measuring a job" in m["message"] and "the lab's queue is down" in m["message"]

    # a device that does not say what it measures on is refused before anything is reserved
    nokind = _kscout(["measure", problem, candidate, "--device", "lab-nokind", "--run-dir", str(tmp_path / "c"), "--json"], env,
                     tmp_path)
    m = json.loads(nokind.stdout)
    assert nokind.returncode == 2 and m["status"] == "invalid_problem" and "a `device` attribute of 'cpu' or 'cuda'" in m["message"]
    assert not (tmp_path / "c" / "run.db").exists() or _measurements(tmp_path / "c") == []

    # an unknown name lists the installed ones
    unknown = _kscout(["measure", problem, candidate, "--device", "lab-nope", "--run-dir", str(tmp_path / "d")], env, tmp_path)
    assert unknown.returncode == 2 and "an installed package's: lab-box, lab-broken, lab-flapping, lab-nokind, lab-off" in unknown.stdout + unknown.stderr


def test_kscout_slot_refuses_what_is_not_a_job_and_a_device_it_does_not_have(tmp_path):
    """(Measuring a job it is given is what the search and measure tests above do through the plugin.)"""
    bad = subprocess.run([sys.executable, "-m", "kernelscout", "slot"], input='{"kind": "code"}', capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "stdin is not a job" in bad.stderr and bad.stdout == ""
    from kernelscout.sandbox.harness import HarnessConfig
    from kernelscout.sandbox.problem import load_candidate, load_problem
    from kernelscout.sandbox.slot import CodeJob

    job = CodeJob.from_files(load_problem(str(EXAMPLES / "softmax" / "problem.py")),
                             load_candidate(str(EXAMPLES / "softmax" / "naive.py")), HarnessConfig(device="cpu"))
    elsewhere = subprocess.run([sys.executable, "-m", "kernelscout", "slot", "--device", "tpu"], input=job.model_dump_json(),
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert elsewhere.returncode == 2 and "unknown device" in elsewhere.stderr and elsewhere.stdout == ""


def test_a_device_that_breaks_stops_the_search_by_name_and_once_fixed_measures_under_the_same_reservation(tmp_path):
    broken = _install(tmp_path / "site", "[kernelscout.devices]\nlab-queue = lab_kscout:Broken\n", module=DEVICE_PLUGIN)
    run = tmp_path / "run"
    args = ["optimize", str(EXAMPLES / "softmax"), "--device", "lab-queue", "--budget", "2", "--confirm", "0", "--run-dir", str(run)]
    stopped = _kscout(args, broken, tmp_path)
    assert stopped.returncode != 0 and "the device 'lab-queue' failed measuring a job" in stopped.stderr, stopped.stderr
    assert f"kscout resume {run}" in stopped.stderr
    ledger = lambda: sqlite3.connect(run / "run.db").execute("SELECT id, state FROM ledger ORDER BY id").fetchall()  # noqa: E731
    assert ledger() == [(1, "reserved")] and _measurements(run) == []  # the job's reservation is kept, nothing recorded

    fixed = _install(tmp_path / "fixed", "[kernelscout.devices]\nlab-queue = lab_kscout:LabBox\n", module=DEVICE_PLUGIN)
    resumed = _kscout(["resume", str(run), "--json"], fixed, tmp_path)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["measurements_used"] == 2, resumed.stdout + resumed.stderr
    assert ledger() == [(1, "charged"), (2, "charged")]  # the kept reservation was measured, not paid for again


def test_a_device_that_is_down_spends_nothing_more_and_says_so(tmp_path):
    env = _install(tmp_path / "site", ENTRY_POINTS, module=DEVICE_PLUGIN)
    problem, candidate = str(EXAMPLES / "softmax" / "problem.py"), str(EXAMPLES / "softmax" / "fast.py")

    # its only worker lost, and no way to bring it back: the measurement stays reserved, not charged, and JSON says so
    off = _kscout(["measure", problem, candidate, "--device", "lab-off", "--run-dir", str(tmp_path / "a"), "--json"], env, tmp_path)
    m = json.loads(off.stdout)
    assert m["status"] == "crashed" and not m["charged"] and "every measurement worker of device lab-off" in m["message"]
    budget = _kscout(["budget", str(tmp_path / "a"), "--json"], env, tmp_path)
    assert json.loads(budget.stdout)["reserved"] == 1  # in flight: the same measurement asked again uses it

    # workers that "recover" and are lost again at once: one candidate is charged as crashed (it may have killed
    # them), the second in a row stops the search, which a resume continues once the box is up
    run = tmp_path / "run"
    down = _kscout(["optimize", str(EXAMPLES / "softmax"), "--device", "lab-flapping", "--budget", "10", "--confirm", "0",
                    "--run-dir", str(run)], env, tmp_path)
    assert down.returncode == 2 and "lost on every attempt at 2 jobs in a row" in down.stderr, down.stderr
    assert "Traceback" not in down.stderr and f"kscout resume {run}" in down.stderr
    status = json.loads(_kscout(["budget", str(run), "--json"], env, tmp_path).stdout)
    assert (status["used"], status["reserved"]) == (2, 1)


def test_two_kscout_slots_at_once_on_one_machine_each_measure_their_own_job(tmp_path):
    """A plugin with two workers on one box runs two `kscout slot` at once; neither may take the other's sandbox worker
    for one a killed slot left behind (each slot reaps the leftovers of a slot of its own name)."""
    import glob
    import tempfile
    import time

    from kernelscout.sandbox.harness import HarnessConfig
    from kernelscout.sandbox.problem import load_candidate, load_problem
    from kernelscout.sandbox.slot import CodeJob, SlotResult

    job = CodeJob.from_files(load_problem(str(EXAMPLES / "softmax" / "problem.py")),
                             load_candidate(str(EXAMPLES / "softmax" / "naive.py")), HarnessConfig(device="cpu")).model_dump_json()
    pattern = str(Path(tempfile.gettempdir()) / "kscout-slot-*slot.pgid")
    before = set(glob.glob(pattern))
    first = subprocess.Popen([sys.executable, "-m", "kernelscout", "slot", "--device", "cpu"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    first.stdin.write(job)
    first.stdin.close()
    deadline = time.time() + 120
    while not set(glob.glob(pattern)) - before and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # until the first slot's sandbox worker is running
    second = subprocess.run([sys.executable, "-m", "kernelscout", "slot", "--device", "cpu"], input=job, capture_output=True,
                            text=True, timeout=600, cwd=tmp_path)
    out, err = first.stdout.read(), first.stderr.read()  # small: one line of JSON, a few warnings
    first.wait(timeout=600)
    for stdout, stderr in ((out, err), (second.stdout, second.stderr)):
        m = SlotResult.model_validate_json(stdout).measurement
        assert m.status.value == "ok" and m.correct, (m.status, m.message, stderr[-500:])
