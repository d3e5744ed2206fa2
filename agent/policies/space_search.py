"""The offline policy for a recorded (replayed) tuning space: the surrogate screens the whole space.

A recorded space can be enumerated, so there is no reason to guess where to look. Once the
surrogate can forecast, the unmeasured valid configurations are screened (`Forecaster.screen`, one cheap
pass over the surrogate's predictive means and spreads) and ranked by what measuring each would tell
about the best time in the space (max-value entropy search, `max_value_entropy`; before the seventy-fourth
session by expected improvement over the best measured time), and the top few become this iteration's
proposals. A space larger than `screen_limit` is ranked in a pool: the best of the last ranking plus a
fresh random sample, so an iteration costs the same on 18,000 configurations as on 2,000. The loop
then forecasts each proposal in full with `predict` and measures only what the decision rule
selects, so the forecasts, not the GPU, do the screening. Under the LLM surrogate, which cannot
afford a chat call per configuration, the learned surrogate ranks the space and the LLM's forecasts
decide which proposals are measured.

Before the surrogate can forecast (cold start), the policy proposes a space-filling design: greedy
maximin over the same standardised features the surrogate's Gaussian process measures distance in,
picked from a random sample of the valid configurations (`maximin_design`, `DESIGN_POOL`). Why not random (our
reading, not tested on its own; the measured effect follows): the design reaches both ends of every
parameter's range within a few points, so the first forecasts interpolate between measured
configurations instead of extrapolating to the large block and tile sizes where GPU optima often
sit. On the recorded spaces (8 spaces x 10 seeds, docs/benchmarks.md) it raised the mean fraction of
the optimum found with 20 measurements from 0.808 to 0.844, left it at 0.905 at 50 and cost 0.007 at
100; one-hot columns for small-integer parameters, or design and random points alternating, did
worse. Once the design is used up the cold start draws random configurations. Under a warm start
(`--warm-start`, the same kernel recorded on other devices) the design begins at the `PRIOR_STARTS`
configurations those devices ran fastest: the surrogate cannot use the prior until this device has timed 8
configurations, and a design alone spends them where the prior already says the kernel is slow. On the 7
recorded spaces that have a second GPU it raised the warm-started search by +0.065 / +0.017 / +0.005 of the
optimum at 20 / 50 / 100 measurements (paired over 40 seeds, standard errors 0.013 / 0.009 / 0.005), and cost
convolution_A100, whose optimum is not where the other GPUs' is, 0.040 at 20 (docs/search_experiments.md,
seventy-sixth session). When the search runs without a surrogate (`--surrogate none`), the policy does what
needs no model: moves to neighbouring values of the parent's parameters plus random restarts. The policy
never reads the measurement budget, so a run's first N measurements are the same whatever the cap
(benchmarks rely on this).
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, Field

from kernelscout.sandbox.replay import ReplaySpace
from kernelscout.tools.surrogates.features import ConfigEncoder

# valid configurations the design is picked from (all of them in a smaller space); a sample this small has
# less extreme corners than the whole space and varies more from seed to seed (docs/search_experiments.md,
# 2026-12-03, against a pool of 4096: +0.010 / +0.007 / +0.005 of the optimum at 20 / 50 / 100 over 60 fresh
# seeds, -0.049 / -0.023 / +0.009 on the published table's seeds 0-9, +0.001 / +0.003 / +0.005 over all 70)
DESIGN_POOL = 512
EXHAUSTED = "every configuration of the space has been measured (the reference's is timed in every session)"
DESIGN_SIZE = 24  # at six proposals per iteration, the first four iterations; random configurations follow
PRIOR_STARTS = 3  # under a warm start, the design's first points: the configurations the other devices ran fastest
MES_QUANTILES = 16  # draws of the pool's best time that the screen's ranking averages over (max_value_entropy)


def maximin_design(features: np.ndarray, n: int, first: int = 0) -> list[int]:
    """Rows of `features` chosen greedily so that each is as far as possible from those already
    chosen (Euclidean, per-column standardised), starting from row `first`."""
    if features.shape[0] == 0:
        return []
    sd = features.std(axis=0)
    x = (features - features.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    chosen = [first]
    dist = ((x - x[first]) ** 2).sum(axis=1)
    for _ in range(min(n, x.shape[0]) - 1):
        j = int(np.argmax(dist))
        if dist[j] <= 0:  # only duplicates of chosen rows are left
            break
        chosen.append(j)
        dist = np.minimum(dist, ((x - x[j]) ** 2).sum(axis=1))
    return chosen


def max_value_entropy(screen: Any, quantiles: int = MES_QUANTILES) -> np.ndarray:
    """How much measuring each screened configuration would tell about the best time in the pool (max-value entropy
    search, minimising log-time), times the chance that it runs.

    Why not expected improvement alone: expected improvement is spent near configurations already known to be good,
    while on a space whose optimum is a needle (a few configurations within 10 % of it) the search first has to learn
    where the best time lies at all. This scores a configuration by how far its forecast's spread reaches below the
    plausible best times: the pool's minimum is drawn at `quantiles` evenly spaced quantiles of its distribution under
    independent normal forecasts (a grid of 512 times from six spreads below the lowest mean up to that mean, where the
    upper quantiles stop), and each gives the entropy a measurement removes from a forecast truncated at that minimum.
    Paired with expected improvement over 90 seeds of five recorded spaces, it raised the mean fraction of the optimum
    at 50 measurements by 0.013 (standard error 0.007) and lost at no budget (docs/search_experiments.md)."""
    # the normal's log-cdf and cdf as plain ufuncs: through scipy.stats the ranking took 3.3 s of a 100-measurement
    # search on convolution_A100, 2.0 s this way
    from scipy.special import log_ndtr, ndtr

    mu = np.asarray(screen.mu, dtype=float)
    sd = np.maximum(np.asarray(screen.scale, dtype=float), 1e-9)
    grid = np.linspace(float(np.min(mu - 6 * sd)), float(np.min(mu)), 512)
    # a forecast whose mean lies six spreads above the grid's top adds under 1e-9 to any of its log-probabilities
    near = mu - 6 * sd <= grid[-1]
    log_above = log_ndtr((mu[near][None, :] - grid[:, None]) / sd[near][None, :]).sum(axis=1)  # log P(every time > y)
    best = np.interp((np.arange(quantiles) + 0.5) / quantiles, 1.0 - np.exp(log_above), grid)
    gamma = (mu[None, :] - best[:, None]) / sd[None, :]
    below = np.clip(ndtr(gamma), 1e-12, 1.0)
    density = np.exp(-0.5 * gamma ** 2) / np.sqrt(2 * np.pi)
    gain = np.mean(gamma * density / (2 * below) - np.log(below), axis=0)
    return gain * (1.0 - np.asarray(screen.p_fail, dtype=float))


def _by_information(screen: Any) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a screen's rows, most informative first (`max_value_entropy`), among equals the lower predicted
    time; and the scores."""
    score = max_value_entropy(screen)
    return np.lexsort((np.asarray(screen.mu), -score)), score


def _by_expected_improvement(screen: Any) -> np.ndarray:
    """Indices of a screen's rows, highest expected improvement first; among equals the lower predicted time."""
    return np.lexsort((np.asarray(screen.mu), -np.asarray(screen.expected_improvement)))


def _not_candidates(parent: dict[str, Any]) -> set[str]:
    """What a proposal must not be: a configuration already tried, or the reference's, which is timed in every
    session. (The screen passes over the reference by its row instead, so that its pool is drawn as before.)"""
    return parent["tried"] | {parent.get("reference_sha")}


class SpaceProposal(BaseModel):
    source: Optional[str] = None  # configurations have no source; the archive keys them by their values
    origin: str
    params: dict[str, Any]
    hypothesis: str = ""
    features: dict[str, Any] = Field(default_factory=dict)


class SpaceSearchPolicy:
    def __init__(self, space: ReplaySpace, random_fraction: float = 0.34, forecaster: Any = None,
                 screen_limit: int = 2048, carry: int = 512):
        self.space = space
        self.screen_limit, self.carry = screen_limit, carry
        self._ranked: list[int] = []  # best of the last ranking, carried into the next pool
        self._proposed: set[int] = set()  # rows this policy proposed, which the design does not propose again
        self._keys: Optional[list[tuple]] = None
        self.random_fraction = random_fraction
        self.forecaster = forecaster
        self._valid = [i for i in range(len(space))]
        self._values = np.empty((len(space), len(space.param_names)), dtype=object)
        for i, row in enumerate(space.configs):
            self._values[i, :] = row
        self._shas: Optional[list[str]] = None
        self._row_of: dict[str, int] = {}  # content key -> row, for the shelved keys the loop hands back
        self._design: Optional[list[int]] = None  # cold-start design, rows of the space
        self._starts: Optional[list[int]] = None  # the design's first rows under a warm start (`_prior_starts`)
        self.notes: list[str] = []  # read by the loop: said once, and named if the search stops for want of proposals
        self.chance_left: Optional[float] = None  # read by the loop, which stops a solved search (`_chance_left`)

    def state_dict(self) -> dict[str, Any]:
        """What this policy remembers between iterations that run.db does not hold: the best of the last ranking (a
        space too large to screen whole), the design and what it proposed, this iteration's chance left. The loop
        checkpoints it with its own state, so that a resumed search proposes what the uninterrupted one would have.
        (The warm start's first rows are not in it: they follow from the priors, which a resumed search has too.)"""
        design = [int(i) for i in self._design or []]
        # of the rows proposed, only the design's are read again (the rest are in run.db, as tried)
        return {"ranked": [int(i) for i in self._ranked], "proposed": [i for i in design if i in self._proposed],
                "design": None if self._design is None else design,
                "chance_left": self.chance_left}  # this iteration's, for a search killed before it read it

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ranked = list(state.get("ranked", []))
        self._proposed = set(state.get("proposed", []))
        self._design = state.get("design")
        self.chance_left = state.get("chance_left")

    def attach_forecaster(self, forecaster: Any) -> None:
        """The loop's forecaster, whose `screen` ranks the whole space (absent: model-free proposals)."""
        self.forecaster = forecaster

    # -- model-free moves ---------------------------------------------------------------------
    def _neighbours(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for name in self.space.param_names:
            values = list(self.space.param_values[name])
            try:
                pos = values.index(config[name])
            except ValueError:
                continue
            for step in (-2, -1, 1, 2):
                j = pos + step
                if 0 <= j < len(values):
                    cand = dict(config, **{name: values[j]})
                    if self.space.index_of(cand) is not None:
                        out.append(cand)
        return out

    def _local_and_random(self, parent: dict[str, Any], k: int, rng: random.Random, random_only: bool) -> list[SpaceProposal]:
        tried = _not_candidates(parent)
        base: Optional[dict] = None if random_only else parent.get("config")
        picks: list[tuple[str, dict]] = []
        seen = set()

        def add(origin: str, cfg: dict) -> None:
            key = parent["sha"](cfg)
            if key not in tried and key not in seen:
                seen.add(key)
                picks.append((origin, cfg))

        n_random = k if base is None else max(1, round(k * self.random_fraction))
        if base is not None:
            neigh = self._neighbours(base)
            rng.shuffle(neigh)
            for cfg in neigh:
                if len(picks) >= k - n_random:
                    break
                add("neighbour", cfg)
        attempts = 0
        while len(picks) < k and attempts < 50 * k:
            attempts += 1
            add("random", self.space.config(rng.choice(self._valid)))
        return [SpaceProposal(origin=o, params=c, hypothesis=f"{o} of the parent configuration" if o == "neighbour" else "random restart",
                              features=dict(c)) for o, c in picks]

    def _prior_starts(self) -> list[int]:
        """Under a warm start, the configurations the other devices ran fastest (mean standardised log-time over the
        priors; a configuration a prior never timed counts at its prior's imputed value), best first."""
        if self._starts is None:
            priors = self._priors()
            rows = np.asarray(self._valid, dtype=int)
            z = np.mean([p.feature(self._values[rows], self.space.param_names) for p in priors], axis=0) if priors else None
            self._starts = [] if z is None else [int(rows[i]) for i in np.argsort(z, kind="stable")[:PRIOR_STARTS]]
        return self._starts

    def _priors(self) -> list[Any]:
        return list(getattr(self.forecaster, "priors", None) or [])

    def _design_proposals(self, parent: dict[str, Any], k: int, rng: random.Random) -> list[SpaceProposal]:
        """The next `k` configurations of the cold-start design that are neither measured nor proposed."""
        if self._design is None:
            gen = np.random.default_rng(rng.getrandbits(64))
            rows = np.asarray(self._valid, dtype=int)
            if rows.size > DESIGN_POOL:
                rows = gen.choice(rows, size=DESIGN_POOL, replace=False)
            features = ConfigEncoder(self.space.param_values).transform(self._values[rows]).compact
            spread = [int(rows[i]) for i in maximin_design(features, DESIGN_SIZE, first=int(gen.integers(rows.size)))]
            starts = self._prior_starts()
            self._design = starts + [r for r in spread if r not in starts][:DESIGN_SIZE - len(starts)]
        tried = _not_candidates(parent)
        out = []
        for position, idx in enumerate(self._design, start=1):
            if idx in self._proposed:
                continue
            cfg = self.space.config(idx)
            if parent["sha"](cfg) in tried:
                continue
            self._proposed.add(idx)
            what = (f"warm start: among the {PRIOR_STARTS} fastest on {', '.join(p.name for p in self._priors())}"
                    if idx in self._prior_starts() else "space-filling")
            out.append(SpaceProposal(origin="design", params=cfg, features=dict(cfg),
                                     hypothesis=f"{what} design point {position} of {len(self._design)} (cold start)"))
            if len(out) == k:
                break
        return out

    # -- surrogate screening ------------------------------------------------------------------
    def _untried(self, parent: dict[str, Any]) -> np.ndarray:
        if self._shas is None:
            self._shas = [parent["sha"](self.space.config(i)) for i in range(len(self.space))]
            self._row_of = {sha: i for i, sha in enumerate(self._shas)}
        tried: set[str] = parent["tried"]
        return np.asarray([i for i, s in enumerate(self._shas) if s not in tried], dtype=int)

    def _pool(self, untried: np.ndarray, rng: random.Random) -> np.ndarray:
        """The unmeasured configurations screened this iteration: all of them in a space of up to
        `screen_limit`; in a bigger one the best `carry` of the last ranking plus a fresh random sample,
        so the cost per iteration stays flat while every configuration keeps coming up for ranking."""
        if untried.size <= self.screen_limit:
            return untried
        mask = np.zeros(len(self.space), dtype=bool)
        mask[untried] = True
        keep = np.asarray([i for i in self._ranked if mask[i]][: self.carry], dtype=int)
        mask[keep] = False
        rest = np.flatnonzero(mask)
        sample = np.random.default_rng(rng.getrandbits(64)).choice(rest, size=min(rest.size, self.screen_limit - keep.size), replace=False)
        return np.concatenate([keep, np.sort(sample)])

    def _screened(self, parent: dict[str, Any], k: int, rng: random.Random) -> Optional[list[SpaceProposal]]:
        self.chance_left = None  # this iteration's, or none: an earlier screen's chance must not stop the search
        if self.forecaster is None or not hasattr(self.forecaster, "screen"):
            return None
        untried = self._untried(parent)
        # earlier proposals not yet measured ride along (a few rows, read from the loop, so after a resume too): the
        # loop forecasts those in its queue again this iteration and then reads this pass instead of asking the
        # surrogate a second time; shelved ones may be revived (see _revived). Both count in the chance left.
        shelved = self._shelved_rows(parent)
        waiting = self._rows(parent.get("waiting", ()))
        reference = self._row_of.get(parent.get("reference_sha", ""))
        if untried.size - int(reference is not None and reference in untried) == 0:
            return self._best_shelved(shelved, k)  # every configuration tried: what was shelved is all that is left
        pool = self._pool(untried, rng)
        self._proposed |= shelved | waiting
        extra = np.asarray(sorted((shelved | waiting) - set(pool.tolist())), dtype=int)
        rows = np.concatenate([pool, extra]).astype(int)
        scorer = getattr(self.forecaster, "screener", None) or self.forecaster  # the LLM's learned screener
        same_order = list(getattr(getattr(scorer, "surrogate", None), "param_names", [])) == list(self.space.param_names)
        if self._keys is None and same_order:
            self._keys = [tuple(r) for r in self._values]
        keys = [self._keys[i] for i in rows] if self._keys is not None else None
        screened = self.forecaster.screen(self._values[rows], keys=keys)
        if screened is None:
            return None
        full = type(screened)(*(None if a is None else np.asarray(a) for a in screened))
        screen = type(screened)(*(None if a is None else a[: pool.size] for a in full))
        self.chance_left = self._chance_left(full, pool.size, untried.size)
        ranking, information = _by_information(screen)
        self._ranked = pool[ranking[: max(self.carry, k)]].tolist()
        # the reference is timed in every session, never a candidate of its own; it is passed over here,
        # not left out of the pool, so that the pool (and its random part) is drawn as if it were not special
        top = ranking[pool[ranking] != reference][:k] if reference is not None else ranking[:k]
        unmeasured = untried.size - int(reference is not None and reference in untried)
        out = self._revived(shelved, rows, full, pool.size, top)
        for rank, j in enumerate(top, start=1):
            idx = int(pool[j])
            self._proposed.add(idx)
            cfg = self.space.config(idx)
            scope = f"{unmeasured} unmeasured configurations" if pool.size == unmeasured else \
                f"{pool.size} screened of {unmeasured} unmeasured configurations"
            out.append(SpaceProposal(
                origin="screened", params=cfg, features=dict(cfg),
                hypothesis=f"rank {rank} of {scope} by what it would tell about the best time ({information[j]:.3g} nats; "
                           f"expected improvement {screen.expected_improvement[j]:.3g} in log-time; P(fail) {screen.p_fail[j]:.2f})",
            ))
        return out

    @staticmethod
    def _chance_left(full: Any, n_pool: int, n_untried: int) -> Optional[float]:
        """An upper bound on the chance that some configuration not yet measured beats the best by a clear margin:
        the sum of each one's chance (the union bound), over the screened pool scaled up to every untried
        configuration, plus the rows after the pool: the earlier proposals still unmeasured (in the loop's queue or
        shelved, as run.db has them, so that a resumed search sums what the search that stopped summed)."""
        p = getattr(full, "p_clear_win", None)
        if p is None:
            return None
        pool = float(np.sum(p[:n_pool]))
        return pool * (n_untried / n_pool if n_pool else 0.0) + float(np.sum(p[n_pool:]))

    def _best_shelved(self, shelved: set[int], k: int) -> Optional[list[SpaceProposal]]:
        """Once no configuration is left untried, the shelved ones the model ranks highest, `k` at a time (None
        while the model cannot rank: the cold start's own order takes them back)."""
        if not shelved:
            return []
        rows = np.asarray(sorted(shelved), dtype=int)
        screened = self.forecaster.screen(self._values[rows])
        if screened is None:
            return None
        ranking = _by_expected_improvement(screened)[:k]
        return [SpaceProposal(origin="screened", params=self.space.config(int(rows[j])), features=self.space.config(int(rows[j])),
                              hypothesis=f"shelved earlier; every configuration has been tried, and this one ranks {rank} "
                                         f"of the {rows.size} shelved by expected improvement")
                for rank, j in enumerate(ranking, start=1)]

    def _revived(self, shelved: set[int], rows: np.ndarray, full: Any, n_pool: int, top: np.ndarray) -> list[SpaceProposal]:
        """Shelved candidates (worth measuring, but they lost their place in the loop's queue) that the
        model now ranks above this iteration's last fresh proposal by expected improvement (as tested in the
        twenty-third session; the fresh proposals are ranked by `max_value_entropy`). They come on top of the fresh
        ones, so reviving never costs the search a new configuration; without it, a configuration shelved
        early, while the model was still poor, was never looked at again (on convolution_A100 that was
        the optimum itself in two of six runs)."""
        if not shelved or top.size == 0:
            return []
        # `top` indexes the pool, which is the first n_pool rows of the screen
        last = (-full.expected_improvement[top[-1]], full.mu[top[-1]])
        out = []
        for j in range(n_pool, rows.size):
            idx = int(rows[j])
            if idx in shelved and (-full.expected_improvement[j], full.mu[j]) < last:
                cfg = self.space.config(idx)
                out.append(SpaceProposal(
                    origin="screened", params=cfg, features=dict(cfg),
                    hypothesis=f"shelved earlier, now ranked among the top {top.size} by expected improvement "
                               f"({full.expected_improvement[j]:.3g} in log-time; P(fail) {full.p_fail[j]:.2f})"))
        return out

    def propose(self, parent: dict[str, Any], k: int, rng: random.Random) -> list[SpaceProposal]:
        out = self._propose(parent, k, rng)
        if not out and not parent.get("shelved") and EXHAUSTED not in self.notes and \
                all(sha in parent["tried"] or sha == parent.get("reference_sha") for sha in self._all_shas(parent)):
            self.notes.append(EXHAUSTED)
        return out

    def _all_shas(self, parent: dict[str, Any]) -> list[str]:
        if self._shas is None:
            self._untried(parent)
        return self._shas or []

    def _shelved_rows(self, parent: dict[str, Any]) -> set[int]:
        """Rows of the configurations the loop shelved (it hands back their keys; read from run.db, so after a resume too)."""
        self._all_shas(parent)
        return self._rows(parent.get("shelved", ()))

    def _rows(self, shas: Any) -> set[int]:
        return {self._row_of[sha] for sha in shas if sha in self._row_of}

    def _propose(self, parent: dict[str, Any], k: int, rng: random.Random) -> list[SpaceProposal]:
        screened = self._screened(parent, k, rng)
        if screened is not None:
            return screened
        # cold start under a surrogate: a space-filling design it can learn from (random once that
        # is used up); no surrogate: local search
        cold = self.forecaster is not None and not getattr(self.forecaster, "measure_all", True)
        if cold:
            return (self._design_proposals(parent, k, rng) or self._local_and_random(parent, k, rng, random_only=True)
                    or self._shelved_again(parent, k))
        return self._local_and_random(parent, k, rng, random_only=False)

    def _shelved_again(self, parent: dict[str, Any], k: int) -> list[SpaceProposal]:
        """The oldest shelved configurations, once nothing new is left to propose in a cold start: in a space where
        few configurations run, the surrogate may never get the timings it needs to rank them, and a search that
        stopped with them unmeasured would leave its budget unspent beside candidates it had called worth measuring."""
        rows = sorted(self._shelved_rows(parent))
        return [SpaceProposal(origin="design", params=self.space.config(i), features=self.space.config(i),
                              hypothesis="shelved in the cold start, proposed again: nothing new is left to try")
                for i in rows[:k]]
