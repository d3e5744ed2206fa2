"""Problem and candidate files: KernelBench files load as they are; bad files get a clear message."""

import subprocess
import sys
from pathlib import Path

import pytest

from kernelscout.sandbox.problem import InputFileError, load_candidate, load_problem
from kernelscout.tools.schema import MeasureStatus
from conftest import GOOD_CANDIDATE, SMALL_PROBLEM

DATA = Path(__file__).parent / "data" / "kernelbench_format"


def test_kernelbench_layout_problem_loads_and_measures(measure_source):
    problem = (DATA / "1_Linear_Tanh_Scale.py").read_text()
    m = measure_source((DATA / "1_Linear_Tanh_Scale_new.py").read_text(), problem=problem)
    assert m.status == MeasureStatus.ok, m.message
    assert m.correct


def test_kernelbench_problem_whose_output_is_always_zero_is_flagged(measure_source):
    m = measure_source((DATA / "1_Linear_Tanh_Scale_new.py").read_text(), problem=(DATA / "2_Linear_RowMax_Center.py").read_text())
    assert m.status == MeasureStatus.invalid_problem
    assert "too weak" in m.message


DROPOUT_MODEL = """
import torch
import torch.nn as nn

class {name}(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Linear(64, 32)
        self.dropout = nn.Dropout(p)
{eval}
    def forward(self, x):
        return torch.softmax(self.dropout(self.fc(x)), dim=1)
"""
DROPOUT_INPUTS = """
def get_inputs():
    return [torch.randn(128, 64)]

def get_init_inputs():
    return [0.2]
"""


def test_a_reference_with_dropout_in_training_mode_is_refused_before_any_budget_is_spent(measure_source):
    # A forward that draws random numbers can never be matched, so every candidate of a search would come back
    # incorrect and the budget would be gone; the problem is refused instead, saying what to change.
    m = measure_source(DROPOUT_MODEL.format(name="ModelNew", eval=""), problem=DROPOUT_MODEL.format(name="Model", eval="") + DROPOUT_INPUTS)
    assert m.status == MeasureStatus.invalid_problem, m.message
    assert "different outputs for the same inputs" in m.message and "self.eval()" in m.message
    assert not m.charged
    # the fix the message names works
    fixed = "        self.eval()\n"
    m = measure_source(DROPOUT_MODEL.format(name="ModelNew", eval=fixed), problem=DROPOUT_MODEL.format(name="Model", eval=fixed) + DROPOUT_INPUTS)
    assert m.status == MeasureStatus.ok and m.correct, m.message


def test_syntax_error_names_file_and_line(write):
    path = write("cand.py", "import torch\n\nclass ModelNew(\n    def forward(self, x):\n        return x\n")
    with pytest.raises(InputFileError) as err:
        load_candidate(path)
    assert str(path) in str(err.value) and "syntax error at line" in str(err.value)
    assert err.value.kind == "compile_error"


def test_missing_model_new_says_what_to_rename(write):
    path = write("cand.py", "import torch.nn as nn\nclass Model(nn.Module):\n    pass\n")
    with pytest.raises(InputFileError, match="defines no class ModelNew .*rename"):
        load_candidate(path)


def test_problem_without_get_inputs_is_named(write):
    path = write("problem.py", "import torch.nn as nn\nclass Model(nn.Module):\n    pass\ndef get_init_inputs():\n    return []\n")
    with pytest.raises(InputFileError, match="missing get_inputs"):
        load_problem(path)


def test_get_inputs_returning_non_tensors_is_invalid(measure_source):
    problem = SMALL_PROBLEM.replace("return [torch.randn(256, 512), torch.randn(256, 512)]", "return [[1, 2, 3], 'text']")
    m = measure_source(GOOD_CANDIDATE, problem=problem)
    assert m.status == MeasureStatus.invalid_problem
    assert "get_inputs() must return tensors" in m.message
    assert not m.charged


def test_shapes_that_do_not_fit_are_refused_without_allocating(measure_source):
    problem = SMALL_PROBLEM.replace("torch.randn(256, 512), torch.randn(256, 512)", "torch.randn(1 << 20, 1 << 16), torch.randn(1 << 20, 1 << 16)")
    m = measure_source(GOOD_CANDIDATE, problem=problem)
    assert m.status == MeasureStatus.invalid_problem
    assert "does not fit" in m.message and "GiB" in m.message
    assert m.wall_s < 30


def test_cli_reports_bad_input_in_one_message_without_a_traceback(write, tmp_path):
    problem = write("problem.py", SMALL_PROBLEM)
    cand = write("cand.py", "import torch\nclass ModelNew(:\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kernelscout", "measure", str(problem), str(cand), "--device", "cpu", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "syntax error at line 2" in proc.stderr  # a usage error, on stderr as the others are: no measurement table
    assert str(cand) in proc.stderr and "charged" not in proc.stdout
    assert "measuring" not in proc.stderr  # the error line comes alone, before anything runs


def test_cli_shows_the_warnings_of_a_valid_measurement(write, tmp_path):
    problem = write("problem.py", SMALL_PROBLEM)
    idle_pool = "from concurrent.futures import ThreadPoolExecutor\n_POOL = ThreadPoolExecutor(1)\n_POOL.submit(int, 1).result()\n"
    cand = write("cand.py", idle_pool + GOOD_CANDIDATE)
    proc = subprocess.run(
        [sys.executable, "-m", "kernelscout", "measure", str(problem), str(cand), "--device", "cpu", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "timing valid  yes" in proc.stdout
    assert "warning" in proc.stdout and "1 idle thread(s)" in " ".join(proc.stdout.split())


def test_cli_missing_file_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kernelscout", "measure", str(tmp_path / "nope.py"), str(tmp_path / "c.py"), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "no such file" in proc.stdout and "Traceback" not in proc.stderr


def test_a_folder_holding_problem_py_is_that_problem(tmp_path):
    (tmp_path / "softmax").mkdir()
    (tmp_path / "softmax" / "problem.py").write_text(SMALL_PROBLEM)
    assert load_problem(tmp_path / "softmax").path == (tmp_path / "softmax" / "problem.py").resolve()


def test_a_folder_without_problem_py_says_what_to_pass(tmp_path):
    with pytest.raises(InputFileError, match="folder without problem.py; pass a KernelBench .py file or a folder"):
        load_problem(tmp_path)
