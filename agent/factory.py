"""Pluggable by name: targets, policies and forecasters built from a stored SearchSpec."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kernelscout.agent.forecaster import Forecaster, make_forecaster
from kernelscout.agent.search_config import BUILT_IN_POLICIES
from kernelscout.agent.search_spec import SearchSpec
from kernelscout.agent.targets import CodeTarget, ReplayTarget, search_reference_ms
from kernelscout.tools.rundir import RunDir


_MODELS: dict[tuple, Any] = {}


def metered_chat_model(spec: SearchSpec, run: RunDir):
    """One chat model per run, its tokens and USD metered against the run's caps and persisted in run.db."""
    # the caps are part of the key: a resume that raised them (`kscout resume DIR --max-usd X`) gets a meter with the new ones
    key = (str(run.path.resolve()), spec.settings.max_usd, spec.settings.max_llm_tokens)
    if key in _MODELS:
        return _MODELS[key]
    from kernelscout.agent.llm import make_chat_model
    from kernelscout.agent.llm_pricing import RUN_USAGE_META, UsageMeter, stored_usage

    meter = UsageMeter(max_usd=spec.settings.max_usd, max_tokens_total=spec.settings.max_llm_tokens, state=stored_usage(run),
                       on_update=lambda state: run.set_meta(RUN_USAGE_META, state.model_dump_json()))
    model = make_chat_model(meter=meter)
    _MODELS[key] = model
    return model


def make_target(spec: SearchSpec, run: RunDir, pool: Any = None):
    if spec.kind == "space":
        from kernelscout.sandbox.replay import ReplaySpace

        return ReplayTarget(ReplaySpace.load(spec.path, spec.objective), run, seed=spec.settings.seed)
    return CodeTarget(Path(spec.path), spec.device, run, pool=pool)


def make_policy(spec: SearchSpec, target: Any):
    if spec.policy not in BUILT_IN_POLICIES:  # an installed package's (tools/plugins.py): factory(spec, target)
        from kernelscout.tools import plugins

        try:
            return plugins.build(plugins.POLICIES, spec.policy, spec, target)
        except KeyError:
            raise ValueError(f"unknown policy {spec.policy!r}: no installed package declares it (entry point group "
                             f"{plugins.POLICIES}); install the package that provides it") from None
    if spec.kind == "space":
        from kernelscout.agent.policies.space_search import SpaceSearchPolicy

        return SpaceSearchPolicy(target.space)
    if spec.policy == "tuner":
        from kernelscout.agent.policies.rewrites import REWRITES
        from kernelscout.agent.policies.tuner import TunerPolicy

        return TunerPolicy(rewrites=None if spec.rewrites is None else [REWRITES[n] for n in spec.rewrites])
    if spec.policy == "llm":
        from kernelscout.agent.policies.llm_policy import make_llm_policy

        return make_llm_policy(spec, target, model=metered_chat_model(spec, target.run))
    raise ValueError(f"unknown policy {spec.policy!r}")


def make_predictor(spec: SearchSpec, target: Any) -> Forecaster:
    ref = lambda: search_reference_ms(target.run)  # noqa: E731
    if spec.kind == "space":
        from kernelscout.sandbox.replay import ReplaySpace
        from kernelscout.tools.surrogates.warmstart import PriorSource

        priors = [PriorSource.from_space(ReplaySpace.load(p, spec.objective), seed=spec.settings.seed) for p in spec.warm_start]
        if spec.surrogate == "llm":
            return llm_space_forecaster(target, ref, model=metered_chat_model(spec, target.run), seed=spec.settings.seed, priors=priors)
        return make_forecaster(spec.surrogate, target.space.param_values, ref, lambda rec: dict(rec.params),
                               priors=priors, seed=spec.settings.seed, valid=target.space.configs)
    sol = getattr(target, "forecast_floor_ms", None)
    if spec.surrogate == "llm":
        return llm_forecaster(target, ref, model=metered_chat_model(spec, target.run), seed=spec.settings.seed)
    prior, note = history_prior(spec, target.run) if spec.surrogate == "learned" else (None, "")
    forecaster = make_forecaster(spec.surrogate, None, ref, lambda rec: dict(rec.features), seed=spec.settings.seed, sol_ms=sol,
                                 history_prior=prior)
    forecaster.notes = [note] if note else []
    return forecaster


HISTORY_KEY = "history_runs"


def history_prior(spec: SearchSpec, run: RunDir):
    """The prior from earlier runs on this device (tools/surrogates/history.py), or None; and a line saying which.

    Which runs it reads is settled when the search starts and kept in run.db, so a resumed search
    forecasts from the same runs even if the folder has grown since."""
    import json

    from kernelscout.tools.surrogates.history import device_class, find_runs, load_prior

    if not spec.history:
        return None, ""  # off unless asked for: it has not yet been shown to find faster kernels (docs/surrogate.md)
    saved = run.get_meta(HISTORY_KEY)
    if saved is not None:
        runs = json.loads(saved)
    else:
        runs = find_runs(spec.history, device_class(spec.device, run.get_meta("sol_bounds")), exclude=run.path)
        run.set_meta(HISTORY_KEY, json.dumps(runs))
    prior, why_not = load_prior(runs, seed=spec.settings.seed)
    if prior is not None:
        return prior, f"surrogate prior: {prior.describe()}"
    return None, f"no surrogate prior: {why_not}"


def llm_forecaster(target: Any, ref, model: Any = None, seed: int = 0, target_risk: float = 0.05, gate: Any = None) -> Forecaster:
    """The self-reflective LLM surrogate reading parent and child code."""
    from kernelscout.agent.llm import require_chat_model
    from kernelscout.tools.archive import ROOT_ID, Archive
    from kernelscout.tools.surrogates.llm import LLMSurrogate, read_source

    model = require_chat_model(model, "the llm surrogate")
    archive = Archive(target.run)
    bounds = getattr(target, "bounds", None)
    sol = f"{bounds.time_ms:.4g} ms ({bounds.bound}-bound)" if bounds else "unknown"

    def context(rec) -> dict:
        parent_path = str(target.problem) if rec.parent_id in (None, ROOT_ID) else archive.get(rec.parent_id).path
        return {"parent_source": read_source(parent_path), "device": target.device, "sol": sol}

    return Forecaster(LLMSurrogate(model), ref, lambda rec: dict(rec.features), seed=seed, target_risk=target_risk,
                      sol_ms=getattr(target, "forecast_floor_ms", None), code_context=context, gate=gate)


def llm_space_forecaster(target: Any, ref, model: Any = None, seed: int = 0, priors: Sequence[Any] = ()) -> Forecaster:
    """The LLM surrogate on a recorded space: it reads the parent's and the child's parameter values
    (the root's parent is the target's reference configuration) instead of source code. `priors`
    (`--warm-start`): the child's recorded speedup over the parent on other devices goes in the prompt.

    Which configurations are proposed is ranked by the learned surrogate (with the same priors): an
    LLM forecast costs two chat calls, so it decides which of each iteration's few proposals are
    measured, not which of thousands of configurations are proposed."""
    from kernelscout.agent.llm import require_chat_model
    from kernelscout.tools.archive import ROOT_ID, Archive
    from kernelscout.tools.surrogates.llm import SPACE_SOL, LLMSurrogate, describe_config, transfer_lines

    model = require_chat_model(model, "the llm surrogate")
    archive, space = Archive(target.run), target.space

    def context(rec) -> dict:
        parent = target.reference if rec.parent_id in (None, ROOT_ID) else archive.get(rec.parent_id).params
        return {"parent_source": describe_config(space, parent), "child_source": describe_config(space, rec.params),
                "device": space.device_label, "sol": SPACE_SOL, "related": transfer_lines(priors, parent, rec.params)}

    features = lambda rec: dict(rec.params)  # noqa: E731
    screener = make_forecaster("learned", space.param_values, ref, features, priors=list(priors), seed=seed,
                               valid=space.configs)
    return Forecaster(LLMSurrogate(model), ref, features, seed=seed, code_context=context, screener=screener, priors=priors)
