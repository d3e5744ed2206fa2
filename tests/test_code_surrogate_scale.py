"""A code search's learned surrogate fits each measurement on the run's reference scale, not on its raw time.

Each measurement times the reference beside the candidate, so a CPU VM that slows down for a while makes both slow:
the speedup stays the candidate's, the raw time does not.
"""

from __future__ import annotations

import math

import numpy as np

from kernelscout.agent.forecaster import OpenSpaceSurrogate, on_reference_scale
from kernelscout.tools.schema import Measurement, MeasureStatus


def timed(runtime_ms: float, ref_ms: float) -> Measurement:
    return Measurement(status=MeasureStatus.ok, correct=True, timing_valid=True, runtime_ms=runtime_ms,
                       ref_runtime_ms=ref_ms, speedup=ref_ms / runtime_ms)


def test_a_measurement_is_put_on_the_reference_scale_and_a_failure_is_left_as_it_is():
    assert on_reference_scale(timed(15.0, 30.0), reference_ms=10.0).runtime_ms == 5.0  # twice as fast as the reference
    assert on_reference_scale(timed(15.0, 30.0), reference_ms=None).runtime_ms == 15.0
    failed = Measurement(status=MeasureStatus.runtime_error)
    assert on_reference_scale(failed, reference_ms=10.0) == failed


def _searched(surrogate: OpenSpaceSurrogate) -> OpenSpaceSurrogate:
    """Six compiled kernels (2x the reference) measured while the machine ran three times slower than it later did,
    then six plain ones (as fast as the reference) once it had sped up: by raw time the plain ones look faster."""
    for i in range(6):
        surrogate.update({"kind": "compiled", "variant": f"c{i}"}, timed(15.0 * (1 + 0.01 * i), 30.0 * (1 + 0.01 * i)))
        surrogate.update({"kind": "plain", "variant": f"p{i}"}, timed(10.0 * (1 + 0.01 * i), 10.0 * (1 + 0.01 * i)))
    return surrogate


def test_a_slow_spell_of_the_machine_does_not_make_the_faster_kernels_look_slower():
    new = [{"kind": "compiled", "variant": "c9"}, {"kind": "plain", "variant": "p9"}]
    reference_ms = 10.0  # the run's reference time, at the pace forecasts are made at
    dist = _searched(OpenSpaceSurrogate("learned", seed=0, reference_ms=lambda: reference_ms)).predictive(new)
    compiled, plain = np.exp(dist.mu)
    assert compiled < plain
    assert dist.p_faster_than(np.full(2, math.log(reference_ms)))[0] > 0.8  # a compiled child beats a parent at the reference

    # fitted on raw times (as before 2026-12-06, and still when no reference is known) the order was the machine's
    raw = _searched(OpenSpaceSurrogate("learned", seed=0)).predictive(new)
    assert np.exp(raw.mu[0]) > np.exp(raw.mu[1])
