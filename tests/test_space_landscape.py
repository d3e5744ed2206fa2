"""benchmarks/space_landscape.py finds the configurations no single parameter change improves on."""

import importlib.util
import math
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "space_landscape.py"
spec = importlib.util.spec_from_file_location("space_landscape", SCRIPT)
space_landscape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(space_landscape)


def test_a_trap_one_change_cannot_leave_is_found_with_the_jump_that_leaves_it():
    # (x, y): time. (3, 2) is a trap: each of its one-change neighbours is slower, the optimum is two changes away.
    times = {(1, 1): 1.0, (2, 1): 3.0, (3, 1): 4.0, (4, 1): math.nan, (1, 2): 5.0, (2, 2): 3.0, (3, 2): 2.0}
    values = np.array(list(times), dtype=object)
    r = space_landscape.landscape(np.array(list(times.values())), values, top=5)
    assert r["configurations"] == 7 and r["local_optima"] == 2
    optimum, trap = r["fastest"]
    assert optimum["frac_of_opt"] == 1.0
    assert trap == {"frac_of_opt": 0.5, "best_one_change": round(1 / 3, 4), "best_two_changes": 1.0,
                    "neighbours_one": 3, "neighbours_two": 2}  # the failed (4, 1) counts as no neighbour


def test_a_needle_is_told_from_a_plateau_by_how_many_configurations_come_close_to_the_optimum():
    needle = np.array([1.0, 1.2, 2.0, 3.0, math.nan])  # the runner-up at 1 / 1.2 of the optimum
    plateau = np.array([1.0, 1.005, 1.04, 1.08, 2.0])
    values = np.array([[v] for v in range(5)], dtype=object)
    r = space_landscape.landscape(needle, values, top=1)
    assert r["timed"] == 4 and r["within"] == {"0.99": 1, "0.95": 1, "0.9": 1} and r["runner_up"] == round(1 / 1.2, 4)
    r = space_landscape.landscape(plateau, values, top=1)
    assert r["timed"] == 5 and r["within"] == {"0.99": 2, "0.95": 3, "0.9": 4} and r["runner_up"] == round(1 / 1.005, 4)
