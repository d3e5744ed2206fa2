"""A candidate that hangs, segfaults, exhausts memory or exits gets its status, and the next measurement still works."""

import time
from pathlib import Path
from typing import Optional

from kernelscout.sandbox.pool import default_memory_bytes
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, QUICK, SMALL_PROBLEM

FAST_TIMEOUT = QUICK.model_copy(update={"timeout_s": 5.0})


def _candidate_with(body: str, imports: str = "") -> str:
    return f'''
import torch
import torch.nn as nn
{imports}

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
{body}
        return torch.relu(x * self.scale + y) + 0.5 * x
'''


def _then_healthy(measure_source):
    m = measure_source(GOOD_CANDIDATE, name="after.py")
    assert m.status == MeasureStatus.ok, m.message


def test_infinite_loop_times_out_within_the_limit(measure_source):
    t0 = time.monotonic()
    m = measure_source(_candidate_with("        while True:\n            pass"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.timeout
    assert "5 s" in m.message and "killed" in m.message
    assert time.monotonic() - t0 < 5.0 + 15.0
    assert m.charged
    _then_healthy(measure_source)


def test_segfault_is_reported_as_a_crash(measure_source):
    m = measure_source(_candidate_with("        ctypes.string_at(0)", imports="import ctypes"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.crashed
    assert "SIGSEGV" in m.message
    _then_healthy(measure_source)


def test_huge_allocation_is_a_runtime_error(measure_source):
    # 256 GiB is over the worker's memory cap on every machine (at most 64 GiB, sandbox.pool.default_memory_bytes):
    # 50 GiB, as this test once asked for, fitted under the cap of a 128 GiB GPU host and was a slow fill, not an error.
    assert default_memory_bytes() < 256 * 2**30
    m = measure_source(_candidate_with("        big = torch.empty(256 * 2**30, dtype=torch.uint8)\n        big.fill_(1)"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.runtime_error
    assert "memory" in m.message
    _then_healthy(measure_source)


def test_os_exit_is_reported_as_a_crash(measure_source):
    m = measure_source(_candidate_with("        os._exit(3)", imports="import os"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.crashed
    assert "exited with code 3" in m.message
    _then_healthy(measure_source)


def test_hang_at_import_is_a_timeout_and_not_charged(measure_source):
    config = FAST_TIMEOUT.model_copy(update={"compile_timeout_s": 3.0})
    m = measure_source("import time\nwhile True:\n    time.sleep(0.1)\n" + GOOD_CANDIDATE, config=config)
    assert m.status == MeasureStatus.timeout
    assert "importing" in m.message
    assert not m.charged
    _then_healthy(measure_source)


def test_sys_exit_during_forward_is_a_runtime_error(measure_source):
    m = measure_source(_candidate_with("        sys.exit(0)", imports="import sys"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.runtime_error
    assert "sys.exit" in m.message
    _then_healthy(measure_source)


def test_keyboard_interrupt_raised_by_the_candidate_is_its_runtime_error(measure_source):
    m = measure_source(_candidate_with("        raise KeyboardInterrupt"), config=FAST_TIMEOUT)
    assert m.status == MeasureStatus.runtime_error and "KeyboardInterrupt" in m.message
    _then_healthy(measure_source)


def test_a_candidate_importing_a_file_next_to_it_is_told_to_inline_it(measure_source, write):
    write("fastops.py", "def relu(x):\n    return x.clamp_min(0)\n")
    m = measure_source(_candidate_with("        pass", imports="from fastops import relu"))
    assert m.status == MeasureStatus.compile_error
    assert "one self-contained file" in m.message and "fastops.py" in m.message



def test_a_problem_importing_a_file_next_to_it_is_told_to_inline_it(measure_source, write):
    write("helpers.py", "import torch\n\ndef scale(x):\n    return 2 * x\n")
    problem = "from helpers import scale\n" + SMALL_PROBLEM
    m = measure_source(GOOD_CANDIDATE, problem=problem)
    assert m.status == MeasureStatus.invalid_problem and not m.charged
    assert "a problem is one self-contained file" in m.message and "helpers.py" in m.message


def test_a_problem_whose_inputs_ignore_the_seed_is_told_to_leave_the_seeding_out(measure_source):
    problem = SMALL_PROBLEM.replace("def get_inputs():", "def get_inputs():\n    torch.manual_seed(0)", 1)
    m = measure_source(GOOD_CANDIDATE, problem=problem)
    assert m.status == MeasureStatus.invalid_problem and not m.charged
    assert "get_inputs() returns the same inputs whatever the seed" in m.message, m.message


def _problem_that_kills_its_worker(marker: Optional[Path]) -> str:
    """The reference's get_init_inputs() SIGKILLs its worker: always, or only until `marker` exists."""
    if marker is None:
        kill = "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    else:
        kill = (f"    import os, pathlib, signal\n    marker = pathlib.Path({str(marker)!r})\n"
                "    if not marker.exists():\n        marker.touch()\n        os.kill(os.getpid(), signal.SIGKILL)\n")
    return SMALL_PROBLEM.replace("def get_init_inputs():\n", "def get_init_inputs():\n" + kill)


def test_a_worker_killed_before_it_saw_the_candidate_is_no_verdict_on_the_candidate(measure_source, tmp_path):
    m = measure_source(GOOD_CANDIDATE, problem=_problem_that_kills_its_worker(tmp_path / "killed-once"))

    assert m.status == MeasureStatus.ok and m.charged, m.message
    assert any("died before the candidate was loaded" in w and "SIGKILL" in w for w in m.warnings), m.warnings


def test_a_second_death_before_the_candidate_stands_and_costs_nothing(measure_source):
    m = measure_source(GOOD_CANDIDATE, problem=_problem_that_kills_its_worker(None))

    assert m.status == MeasureStatus.crashed and not m.charged
    assert "died before the candidate was loaded" in m.message and "a fresh one died too" in m.message
    assert m.message.count("SIGKILL") == 2
    _then_healthy(measure_source)
