"""Shared fixtures: one warm worker pool for the session, and a way to measure source strings."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.pool import WorkerPool
from kernelscout.tools.measure import MeasureRequest, measure
from kernelscout.tools.schema import Measurement


def _share_the_cores_under_xdist() -> None:
    """Under pytest-xdist (`pytest -n 8`), each test process takes its own share of the cores, and so do the
    sandbox workers it starts, which size their torch thread pools to the cores they may use. Without it every
    sandbox worker ran one thread per core of the machine (15 test processes on a 16-core GPU host: about 240
    threads), and the harness's own time limits tripped, most likely for that (a correct candidate "took longer
    than 20 s"; docs/gpu-validation.md, fifth lease). One process, as CI runs the suite, keeps every core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    i = int(worker[2:])
    os.sched_setaffinity(0, cores[i::count] or [cores[i % len(cores)]])


_share_the_cores_under_xdist()


def usable_cores() -> int:
    """The cores this test process may run on: one under `pytest -n 2` (see above), where a test of what only
    two cores can show is marked `multicore` and run in the README's second, single-process pass."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sigint_as_from_a_terminal() -> None:
    """Ctrl-C tests send SIGINT and expect an interrupt. A suite started as a background job of a shell without job
    control (`nohup pytest &`, `bash -c '... & wait'`) inherits SIGINT ignored, Python then leaves it ignored, and
    so does every process the tests start, since exec keeps ignored signals and the signal mask: three tests of
    tests/test_headless_run.py failed that way in a fresh clone. Handled and unblocked here, as in a terminal, once
    for the suite's process; a test also passes it as `preexec_fn`, so that a child gets SIGINT deliverable even if
    an earlier test left it ignored or blocked (after exec a handled signal is back to its default)."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


sigint_as_from_a_terminal()

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# The device `measure_source` measures on. CPU everywhere the suite runs; on a lent GPU,
# `KSCOUT_TEST_DEVICE=cuda pytest tests/test_adversarial.py` puts every known cheat through the CUDA path.
TEST_DEVICE = os.environ.get("KSCOUT_TEST_DEVICE", "cpu")

# Quick settings: correctness is exercised fully, timing only briefly.
QUICK = HarnessConfig(timeout_s=20.0, compile_timeout_s=300.0, timing_budget_s=0.2, min_rounds=5, warmup_rounds=1)

SMALL_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return torch.relu(x * self.scale + y) + 0.5 * x

def get_inputs():
    return [torch.randn(256, 512), torch.randn(256, 512)]

def get_init_inputs():
    return [1.5]
'''

GOOD_CANDIDATE = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return torch.relu(x * self.scale + y) + 0.5 * x
'''


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path_factory, monkeypatch):
    """The tester's own ~/.config/kscout (an [llm] provider, a [search] budget) must not change what a test
    sees; a test that wants a config file sets XDG_CONFIG_HOME itself."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "no-user-config"))


@pytest.fixture(scope="session", autouse=True)
def _workers_may_write_test_reports(tmp_path_factory):
    """Sandbox workers write only below their scratch folder and the caches (Landlock), yet many tests
    have a candidate or problem report back through a file in the test's tmp_path: those folders are
    added, as a user adds a folder a kernel must write to. A test of the restriction itself keeps its
    run directory elsewhere."""
    base = str(tmp_path_factory.getbasetemp())
    before = os.environ.get("KSCOUT_SANDBOX_WRITE")
    os.environ["KSCOUT_SANDBOX_WRITE"] = base
    yield base
    if before is None:
        os.environ.pop("KSCOUT_SANDBOX_WRITE", None)
    else:
        os.environ["KSCOUT_SANDBOX_WRITE"] = before


@pytest.fixture(scope="session")
def pool(_workers_may_write_test_reports):
    """One pool for the suite's measurements, its workers kept warm across up to 20 candidates that pass
    every check: these candidates are the suite's own, and a fresh worker per measurement tripled the
    suite's time (an unlimited reuse let one test's leftovers slow a later test's reference). Every
    search, `kscout measure` and the MCP server retire a worker after each candidate; the tests that
    depend on that make their own pool."""
    with WorkerPool(candidates_per_worker=20) as p:
        yield p


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return _write


@pytest.fixture
def measure_source(tmp_path: Path, write, pool) -> Callable[..., Measurement]:
    """Measure a candidate given as source text against a problem given as source text."""

    def _measure(candidate: str, problem: str = SMALL_PROBLEM, config: HarnessConfig = QUICK, **kw) -> Measurement:
        p = write("problem.py", problem)
        c = write(kw.pop("name", "candidate.py"), candidate)
        req = MeasureRequest(problem=str(p), candidate=str(c), device=TEST_DEVICE, run_dir=str(tmp_path / "run"), harness=config, again=True, **kw)
        return measure(req, pool=pool)

    return _measure


@pytest.fixture
def local_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A project whose kscout.toml points at a local OpenAI-compatible server (tests/fake_llm_server.py), as an
    Ollama user's would; script its replies with `local_llm.script(...)`."""
    from fake_llm_server import FakeLLMServer

    monkeypatch.chdir(tmp_path)
    with FakeLLMServer() as server:
        (tmp_path / "kscout.toml").write_text(
            f'[llm]\nprovider = "openai-compatible"\nbase_url = "{server.openai_base_url}"\nmodel = "local"\n'
            'api_key = "sk-local-SECRET-0123456789abcdef"\nmax_attempts = 1\n')
        yield server
