"""A recorded space's objective, and how a search that minimises time follows it.

Kernel Tuner writes the objective a space was tuned for into the cache's header (`objective`) but not its
direction, which it knows for the objectives it names itself. Of those, the throughputs (GFLOP/s, GB/s, ...)
are work divided by time. Where every configuration does the same work (a convolution's GFLOP/s), the
throughput ranks configurations as time does and there is nothing to follow. Where the work differs (hotspot's
temporal tiling computes several time steps in one call, and its GFLOP/s counts each of them), the fastest call
is not the highest throughput, and minimising the recorded time would find the configuration that does least.
There the replay gives each configuration the time it would take for one common amount of work, the median
configuration's: minimising that time maximises the objective, and a speedup is a ratio of the objective.

Objectives that are not a speed (energy, GFLOPS/W) and names Kernel Tuner does not know are not followed:
kernelscout makes kernels faster, and it says so in the space's notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional, get_args

if TYPE_CHECKING:
    import numpy as np

Objective = Literal["file", "time"]  # `--objective`: the file's own where kscout can follow it, or the time per call
OBJECTIVE_CHOICES: tuple[str, ...] = get_args(Objective)
THROUGHPUTS = frozenset({"GFLOP/s", "TFLOP/s", "GB/s", "TB/s"})
SAME_WORK = 1.01  # a spread of the work below this is rounding of the recorded objective, not different work


def objective_named(header: Any) -> str:
    """The objective a cache's header names: a string in the hub's caches, a list in those Kernel Tuner 1.5 writes
    (``"objective": ["time"]``, seen; its multi-objective tuning), of one objective unless several were tuned for."""
    if isinstance(header, (list, tuple)):
        names = [str(o) for o in header if o]
        return ", ".join(names) if names else "time"
    return str(header or "time")


def equal_work_factors(times: np.ndarray, throughputs: np.ndarray) -> tuple[Optional[np.ndarray], float]:
    """Per configuration, the factor that turns its recorded time into the time for the median configuration's
    work, and the spread of the work (largest over smallest). No factors where the work is the same throughout,
    so that such a space replays its recorded times exactly."""
    import numpy as np  # here, so that the CLI's and the specs' use of `Objective` costs no numpy import

    work = np.asarray(times, dtype=float) * np.asarray(throughputs, dtype=float)
    spread = float(work.max() / work.min())
    if spread < SAME_WORK:
        return None, spread
    return float(np.median(work)) / work, spread
