"""The offline tuner policy: proposes children of a parent kernel without any LLM.

Two sources of children, both cheap to propose because the forecaster, not the device, screens them:

* the parent's declared tunable space (agent/policies/tunables.py): unvisited neighbours of its
  current configuration first (local search around something that was measured), then random valid
  configurations (so a bad neighbourhood is not a trap);
* generic PyTorch-level rewrites (agent/policies/rewrites.py) that apply to this parent on this
  device, ordered by prior promise: the first variant of each rewrite comes before later variants
  of the most promising one, so a short list is both diverse and led by what usually works.

A child whose source is already in the archive (``tried_shas``) is never proposed again: the sha is
the same sha256 of the source text that ``measure`` keys its results by. Given the same rng seed and
the same parent files, the proposals are the same.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, Field, computed_field

from kernelscout.agent.policies import tunables
from kernelscout.agent.policies.rewrites import REWRITES, Rewrite, StaticFeatures, applicable_rewrites, chain_features, rewrite_of

FeatureValue = Union[float, int, str, bool]
USER_ORIGIN = "user"  # a kernel the user gave with --start


class ParentInfo(BaseModel):
    """The parent the loop picked, as the policy needs to see it."""

    id: Union[int, str]
    path: str = Field(description="the parent's source file (the problem file itself for the reference)")
    is_reference: bool = Field(False, description="the parent is the problem's Model, not a candidate")
    problem_path: str
    device: str = "cpu"
    speedup: Optional[float] = Field(None, description="the parent's measured speedup over the reference")
    tried_shas: set[str] = Field(default_factory=set, description="sha256 of every source already in the archive")


class Proposal(BaseModel):
    """One child candidate: its full source, where it came from and why it might be faster."""

    source: str
    origin: str = Field(description="rewrite:<name>, tunable:neighbour or tunable:random")
    params: dict[str, Any]
    hypothesis: str
    parent_id: Union[int, str, None] = None
    features: dict[str, FeatureValue] = Field(default_factory=dict, description="numbers and categories for a surrogate")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sha(self) -> str:
        return source_sha(self.source)


def source_sha(source: str) -> str:
    """The same digest measure() gives the file holding this source."""
    return hashlib.sha256(source.encode()).hexdigest()


class TunerPolicy:
    """Offline proposals: tunable configurations and generic rewrites, deduplicated against the archive."""

    name = "tuner"
    grows_the_best_first = True  # while nothing can be forecast, the loop measures as agent/cold_start.py orders

    def __init__(self, rewrites: Optional[list[Rewrite]] = None, random_configs: int = 2):
        self.rewrites = rewrites
        self.random_configs = random_configs
        self.notes: list[str] = []  # why a source of proposals was skipped, for the run log

    @property
    def grows_reference(self) -> bool:
        """Whether the reference can be a parent: with no rewrites allowed (`--rewrites none`) only knobs are
        turned, and the reference has none, so the search grows the user's kernels alone."""
        return self.rewrites is None or bool(self.rewrites)

    def propose(self, parent: ParentInfo, k: int, rng: random.Random) -> list[Proposal]:
        self.notes = []
        if parent.is_reference and not self.grows_reference:
            self.notes.append("with --rewrites none only the knobs of measured kernels are turned, and no kernel given "
                              "with --start has a valid timing to tune from")
            return []
        source = Path(parent.path).read_text()
        features = chain_features(parent.path, parent.problem_path)
        seen = set(parent.tried_shas)
        streams = [self._tunable(parent, source, features, rng, k), self._rewrites(parent, features)]
        out: list[Proposal] = []
        while len(out) < k and any(streams):
            for stream in streams:
                while stream:
                    proposal = stream.pop(0)
                    if proposal.sha not in seen:
                        seen.add(proposal.sha)
                        out.append(proposal)
                        break
                if len(out) == k:
                    break
        return out

    # -- tunable space ------------------------------------------------------------------------
    def _tunable(self, parent: ParentInfo, source: str, features: StaticFeatures, rng: random.Random, k: int) -> list[Proposal]:
        if not tunables.declares_space(source):
            return []
        try:
            space = tunables.parse_space(source)
        except tunables.TunableError as exc:
            self.notes.append(f"tunable space of {parent.path} not used: {exc}")
            return []
        configs = [("neighbour", c) for c in tunables.neighbours(space, space.current)]
        exclude = {space.key(space.current)} | {space.key(c) for _, c in configs}
        configs += [("random", c) for c in tunables.random_configs(space, rng, max(self.random_configs, k), exclude)]
        rendered_by = REWRITES.get(rewrite_of(source) or "")
        out = []
        for kind, config in configs:
            changed = {n: v for n, v in config.items() if v != space.current[n] or type(v) is not type(space.current[n])}
            text = ", ".join(f"{n}={v!r}" for n, v in changed.items())
            why = f"{'a neighbouring' if kind == 'neighbour' else 'a random'} configuration of the declared space ({text})"
            if rendered_by is not None:  # a rendered rewrite: say what its new knob values are for
                why += ": " + rendered_by.hypothesis(rendered_by.Params.model_validate(_known(rendered_by, source, config)))
            extra = {"retunes": rendered_by.name if rendered_by else "kernel", **_config_features(space, config)}
            out.append(Proposal(
                source=tunables.with_config(source, config),
                origin=f"tunable:{kind}",
                params=config,
                hypothesis=why,
                parent_id=parent.id,
                features=proposal_features(parent, features, "tunable", kind, extra),
            ))
        return out

    # -- generic rewrites ---------------------------------------------------------------------
    def _rewrites(self, parent: ParentInfo, features: StaticFeatures) -> list[Proposal]:
        """Applicable rewrite variants, ordered by prior promise (variant index + the rewrite's rank offset)."""
        allowed = None if self.rewrites is None else {r.name for r in self.rewrites}
        ranked: list[tuple[float, int, Proposal]] = []
        for rewrite, variants in applicable_rewrites(parent.device, features):
            if allowed is not None and rewrite.name not in allowed:
                continue
            for i, params in enumerate(variants):
                source = rewrite.render(parent.path, params, problem_path=parent.problem_path, device=parent.device,
                                        parent_class="Model" if parent.is_reference else None)
                rank = i + rewrite.rank_offset
                extra = {"prior_rank": rank, **{f"param.{n}": _feature(v) for n, v in params.items()}}
                ranked.append((rank, len(ranked), Proposal(
                    source=source,
                    origin=f"rewrite:{rewrite.name}",
                    params=params,
                    hypothesis=rewrite.hypothesis(rewrite.Params.model_validate(params)),
                    parent_id=parent.id,
                    features=proposal_features(parent, features, rewrite.name, f"v{i}", extra),
                )))
        return [p for _, _, p in sorted(ranked, key=lambda t: t[:2])]


def user_proposal(path: str | Path, problem_path: str | Path, device: str) -> Proposal:
    """A kernel the user brought (`kscout optimize --start FILE`), as a child of the reference.

    It goes through the loop like any proposal (forecast, then measured and archived), so once
    measured it can be picked as a parent, and the tuner turns its declared knobs and wraps it in
    the generic rewrites. The loop measures it whatever the forecast says: the user asked for it.
    """
    path = Path(path)
    source = path.read_text()
    parent = ParentInfo(id=0, path=str(problem_path), is_reference=True, problem_path=str(problem_path), device=device, speedup=1.0)
    extra: dict[str, FeatureValue] = {"declares_space": float(tunables.declares_space(source))}
    return Proposal(source=source, origin=USER_ORIGIN, params={}, parent_id=0,
                    hypothesis=f"the kernel given with --start ({path.name})",
                    features=proposal_features(parent, chain_features(path, problem_path), "user", "given", extra))


def proposal_features(parent: ParentInfo, static: StaticFeatures, kind: str, variant: str,
                      extra: dict[str, FeatureValue]) -> dict[str, FeatureValue]:
    out: dict[str, FeatureValue] = {
        "kind": kind,
        "variant": variant,
        "device": "cuda" if parent.device.startswith("cuda") else "cpu",
        "parent_is_reference": parent.is_reference,
        "parent_speedup": float(parent.speedup) if parent.speedup else 1.0,
        "lineage_length": len(static.lineage),
    }
    for name in [*REWRITES, "tunable"]:
        out[f"is.{name}"] = float(kind == name)
    for name in static.lineage:
        out[f"after.{name}"] = 1.0
    for name, value in static.model_dump(exclude={"lineage"}).items():
        out[f"static.{name}"] = _feature(value)
    out.update(extra)
    return out


def _feature(value: Any) -> FeatureValue:
    if isinstance(value, bool) or value is None:
        return float(bool(value))  # None marks an unset numeric knob (simdlen: detect), read as 0
    if isinstance(value, (int, float, str)):
        return value
    return str(value)


def _known(rewrite: Rewrite, source: str, config: tunables.Config) -> dict[str, Any]:
    """The rewrite's knobs as the new source sets them: tuned ones from config, the rest as rendered."""
    fields = set(rewrite.Params.model_fields)
    return {**tunables.read_constants(source, fields), **{n: v for n, v in config.items() if n in fields}}


def _config_features(space: tunables.TunableSpace, config: tunables.Config) -> dict[str, FeatureValue]:
    """Each knob's value and its relative position in the declared list (0..1), plus the step size."""
    out: dict[str, FeatureValue] = {}
    moved = 0
    for name in space.names:
        options = space.values[name]
        at = next(i for i, v in enumerate(options) if type(v) is type(config[name]) and v == config[name])
        was = next(i for i, v in enumerate(options) if type(v) is type(space.current[name]) and v == space.current[name])
        out[f"param.{name}"] = _feature(config[name])
        out[f"pos.{name}"] = at / max(1, len(options) - 1)
        moved += abs(at - was)
    out["tune.steps"] = moved
    return out
