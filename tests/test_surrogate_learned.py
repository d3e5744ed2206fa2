"""The learned surrogate ranks unseen configurations, knows how unsure it is, and learns online."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from kernelscout.sandbox.replay import ReplayDevice, ReplaySpace
from kernelscout.tools.schema import Measurement, MeasureStatus
from kernelscout.tools.surrogates import metrics as M
from kernelscout.tools.surrogates.ensemble import TailCompressor
from kernelscout.tools.surrogates.learned import LearnedSurrogate
from kernelscout.tools.surrogates.synthetic import write_synthetic_cache
from kernelscout.tools.surrogates.warmstart import PriorSource


@pytest.fixture(scope="module")
def spaces(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReplaySpace, ReplaySpace]:
    d = tmp_path_factory.mktemp("learned")
    a = ReplaySpace.load(write_synthetic_cache(d / "syn_A.json", "GPU A", device_skew=0.0, seed=1))
    b = ReplaySpace.load(write_synthetic_cache(d / "syn_B.json", "GPU B", device_skew=0.6, seed=2))
    return a, b


def _train(space: ReplaySpace, n: int, seed: int, **kwargs) -> tuple[LearnedSurrogate, np.ndarray]:
    """Measure random configs until `n` have a time; return the surrogate and the held-out indices."""
    rng = np.random.default_rng(seed)
    device = ReplayDevice(space)
    surrogate = LearnedSurrogate(space.param_values, seed=seed, **kwargs)
    order = rng.permutation(len(space))
    used = 0
    while surrogate.n_timed < n:
        config = space.config(int(order[used]))
        surrogate.update(config, device.measure(config, rng))
        used += 1
    return surrogate, order[used:]


def _heldout_accuracy(space: ReplaySpace, surrogate: LearnedSurrogate, pool: np.ndarray) -> float:
    pool = pool[space.ok_mask[pool]]
    dist = surrogate.predictive(np.asarray(space.configs, dtype=object)[pool])
    truth = np.log(space.median_times[pool])
    i, j = M.sample_pairs(pool.size, 5000, np.random.default_rng(0))
    return M.pairwise_accuracy(dist.mu, truth, i, j)


def test_ranks_held_out_configurations(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    surrogate, pool = _train(space, 40, seed=0)
    assert _heldout_accuracy(space, surrogate, pool) > 0.85


def test_conformal_interval_covers_about_its_level(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    surrogate, pool = _train(space, 40, seed=1)
    pool = pool[space.ok_mask[pool]]
    dist = surrogate.predictive(np.asarray(space.configs, dtype=object)[pool])
    lo, hi = dist.quantiles([0.1, 0.9]).T
    truth = np.log(space.median_times[pool])
    covered = np.mean((truth >= lo) & (truth <= hi))
    assert 0.65 <= covered <= 0.97


def test_update_learns_from_a_measurement(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    surrogate, pool = _train(space, 20, seed=2)
    target = space.config(int(pool[space.ok_mask[pool]][0]))
    surprising = float(np.exp(surrogate.predictive([target]).mu[0])) * 3.0
    before = surrogate.predictive([target]).mu[0]
    for _ in range(3):
        surrogate.update(target, Measurement(status=MeasureStatus.ok, runtime_ms=surprising))
    after = surrogate.predictive([target]).mu[0]
    assert after > before + 0.2  # moved towards the surprising time
    assert surrogate.n_timed == 23


def test_failures_teach_where_configs_fail(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    surrogate, pool = _train(space, 60, seed=3)
    assert surrogate.n_failed >= 2
    values = np.asarray(space.configs, dtype=object)[pool]
    p = surrogate.p_fail(values)
    failed = np.isin(pool, list(space.failures))
    assert p[failed].mean() > 2 * p[~failed].mean()


def test_irrelevant_measurements_are_ignored(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    surrogate = LearnedSurrogate(space.param_values)
    surrogate.update(space.config(0), Measurement(status=MeasureStatus.budget_exhausted))
    surrogate.update(space.config(0), Measurement(status=MeasureStatus.invalid_problem))
    assert surrogate.n_timed == 0 and surrogate.n_failed == 0
    assert surrogate.predictive([space.config(0)]) is None


def test_warm_start_from_another_gpu_beats_a_cold_start_with_few_measurements(
    spaces: tuple[ReplaySpace, ReplaySpace],
) -> None:
    target, other = spaces
    prior = PriorSource.from_space(other)
    cold, warm = [], []
    for seed in range(2):
        s_cold, pool = _train(target, 12, seed=seed)
        s_warm, pool_w = _train(target, 12, seed=seed, priors=[prior])
        cold.append(_heldout_accuracy(target, s_cold, pool))
        warm.append(_heldout_accuracy(target, s_warm, pool_w))
    assert np.mean(warm) > np.mean(cold) + 0.02
    assert "warm start from syn_B (GPU B)" in s_warm.status()  # the file the user passed, and its device


def test_prior_of_another_kernel_is_refused(spaces: tuple[ReplaySpace, ReplaySpace], tmp_path: Path) -> None:
    target, _ = spaces
    other = PriorSource("elsewhere", {"x": [1, 2]}, [[1], [2]], [1.0, 2.0])
    with pytest.raises(ValueError, match="other parameters"):
        LearnedSurrogate(target.param_values, priors=[other])


def test_online_updates_refresh_between_geometric_cross_fits(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    """Residuals and calibration are redone only when the data grew by `refit_growth`; every other
    measurement only refreshes the ensemble, which still learns from it."""
    space, _ = spaces
    surrogate, pool = _train(space, 20, seed=4)
    assert surrogate.fit().crossfit  # first fit: the whole pipeline
    kinds = []
    ok_pool = pool[space.ok_mask[pool]]
    for idx in ok_pool[:6]:
        surrogate.update(space.config(int(idx)), Measurement(status=MeasureStatus.ok, runtime_ms=1.0))
        surrogate.predictive([space.config(int(ok_pool[-1]))])
        kinds.append(surrogate.last_fit.crossfit)
    # 21..24 timed points refresh; 25 = ceil(20 * 1.25) cross-fits again; 26 refreshes.
    assert kinds == [False, False, False, False, True, False]


def test_cheap_updates_cost_little_cpu(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    """An update between cross-fits (learn one point, forecast a batch) takes tens of ms of CPU at
    ~60 points; the bound is loose because CI machines are shared."""
    space, _ = spaces
    surrogate, pool = _train(space, 60, seed=5)
    batch = np.asarray(space.configs, dtype=object)[pool[:20]]
    surrogate.predictive(batch)
    costs = []
    for idx in pool[20:30]:
        start = time.process_time()
        surrogate.update(space.config(int(idx)), Measurement(status=MeasureStatus.ok, runtime_ms=1.0))
        surrogate.predictive(batch)
        costs.append(time.process_time() - start)
        assert not surrogate.last_fit.crossfit
    assert np.median(costs) < 0.15


def test_growth_below_one_is_refused(spaces: tuple[ReplaySpace, ReplaySpace]) -> None:
    space, _ = spaces
    with pytest.raises(ValueError, match="refit_growth"):
        LearnedSurrogate(space.param_values, refit_growth=0.5)


def test_tail_compression_keeps_order_and_maps_forecasts_back_to_log_time() -> None:
    y = np.log(np.array([1.0, 1.1, 1.3, 2.0, 2.5, 3.0, 4.0, 8.0, 30.0, 300.0]))
    tail = TailCompressor(y)
    z = tail(y)
    assert np.all(np.diff(z) > 0)  # monotone: every order kept
    assert z[-1] - z[-2] < 0.5 * (y[-1] - y[-2])  # the slowest tail is squeezed
    back, slope = tail.inverse(z)
    assert np.allclose(back, y)
    assert slope[-1] == pytest.approx(1 / TailCompressor.SLOPE) and slope[0] == 1.0


def test_configurations_predicted_slow_do_not_look_more_uncertain_for_being_in_the_tail() -> None:
    """A search ranks by expected improvement, which reads the fast side of each forecast; the tail
    compression must not inflate the spread of slow forecasts (it once made them 4x as uncertain, and
    searches spent a third of their measurements on hopeless configurations)."""
    from kernelscout.tools.surrogates.ensemble import LogTimeEnsemble
    from kernelscout.tools.surrogates.features import FeatureBlocks

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(60, 2))
    y = np.where(x[:, 0] > 0.85, 6.0 + 4.0 * x[:, 1], x[:, 0] + 0.5 * x[:, 1])  # a slow cliff beyond x0 = 0.85
    y = y + rng.normal(0, 0.05, size=y.size)
    blocks = FeatureBlocks(full=x, compact=x)
    ens = LogTimeEnsemble(seed=0).fit(blocks, y)
    pred = ens.predict(FeatureBlocks(full=x, compact=x))
    slow, fast = pred.mean > np.quantile(y, 0.9), pred.mean < np.quantile(y, 0.5)
    assert slow.any() and fast.any()
    assert np.median(pred.spread[slow]) < 2.5 * np.median(pred.spread[fast])


def test_a_stride_that_does_not_apply_is_not_judged_by_strides_that_did() -> None:
    """Measured tiles larger than 1 say "stride 0 is four times slower". A tile of 1 has no stride (the
    space forces it to 0): told the valid space, the surrogate does not carry that verdict over."""
    tune = {"tile": [1, 2, 4, 8], "stride": [0, 1], "unroll": [1, 2, 4, 8]}
    valid = [(t, s, u) for t in tune["tile"] for s in tune["stride"] for u in tune["unroll"] if t > 1 or s == 0]

    def fit(**kwargs) -> LearnedSurrogate:
        surrogate = LearnedSurrogate(tune, seed=0, **kwargs)
        for t, s, u in valid:
            if t > 1:
                surrogate.observe({"tile": t, "stride": s, "unroll": u}, (4.0 if s == 0 else 1.0) * (1 + 0.1 * u))
        return surrogate

    tile1 = [{"tile": 1, "stride": 0, "unroll": u} for u in tune["unroll"]]
    blind = float(np.mean(fit().predictive(tile1).mu))
    told = float(np.mean(fit(valid=valid).predictive(tile1).mu))
    slow, fast = np.log(4.0 * 1.25), np.log(1.25)  # mean log-times of stride 0 and stride 1 at tile > 1
    assert blind > fast + 0.75 * (slow - fast)  # judged as a stride-0 configuration
    assert told < blind - 0.2


def test_late_in_a_search_the_slow_quarter_is_fitted_as_equally_slow() -> None:
    """`focus_after`: once enough is measured, the model spends itself on the fast configurations."""
    grid = {"x": list(range(100))}
    slow_times = {x: float(np.exp(x / 20)) for x in range(0, 100, 2)}  # 50 measured, slower with x

    def fitted(focus_after):
        s = LearnedSurrogate(grid, seed=0, focus_after=focus_after)
        for x, t in slow_times.items():
            s.observe({"x": x}, t)
        return s.predictive([{"x": 99}, {"x": 1}]).mu

    plain, before, focused = fitted(None), fitted(51), fitted(50)
    cap = np.percentile(np.log(list(slow_times.values())), 75)
    assert plain[0] > cap + 0.5                    # the plain model follows the slow end
    assert focused[0] < cap + 0.05                 # the focused one sees it as no slower than the cap
    assert np.allclose(before, plain)              # one point short of focus_after: the plain model
    assert abs(focused[1] - plain[1]) < 0.2        # the fast end is still told apart


def test_only_a_search_gets_the_focused_surrogate() -> None:
    from kernelscout.tools.surrogates.learned import SEARCH_FOCUS_AFTER
    from kernelscout.tools.surrogates.registry import make_surrogate

    grid = {"x": [1, 2, 3]}
    assert make_surrogate("learned", grid).focus_after is None  # eval-surrogate ranks the whole space
    assert make_surrogate("learned", grid, for_search=True).focus_after == SEARCH_FOCUS_AFTER
    with pytest.raises(ValueError, match="focus_after"):
        LearnedSurrogate(grid, focus_after=0)
