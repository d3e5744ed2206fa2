"""Surrogates by name, so that the CLI and the agent pick them the same way.

Other surrogates (the LLM forecaster) register themselves here instead of being special-cased.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from kernelscout.tools import plugins
from kernelscout.tools.surrogates.base import NoneSurrogate, Surrogate
from kernelscout.tools.surrogates.learned import SEARCH_FOCUS_AFTER, LearnedSurrogate
from kernelscout.tools.surrogates.warmstart import PriorSource

SurrogateFactory = Callable[..., Surrogate]
"""factory(tune_params, *, priors, seed, valid) -> Surrogate; `valid`: the space's valid configurations
(rows in parameter order) when it can be enumerated, else None"""


def _learned(
    tune_params: Mapping[str, Sequence[Any]], *, priors: Sequence[PriorSource] = (), seed: int = 0,
    valid: Optional[Sequence[Sequence[Any]]] = None, focus_after: Optional[int] = None,
) -> Surrogate:
    return LearnedSurrogate(tune_params, priors=priors, seed=seed, valid=valid, focus_after=focus_after)


def _plain_rf(
    tune_params: Mapping[str, Sequence[Any]], *, priors: Sequence[PriorSource] = (), seed: int = 0, valid: Any = None
) -> Surrogate:
    """The reference point of the issue: a random forest on raw parameter values."""
    return LearnedSurrogate(
        tune_params, members=("rf",), rich_features=False, priors=priors, seed=seed, name="plain-rf"
    )


def _none(tune_params: Mapping[str, Sequence[Any]], *, priors: Sequence[PriorSource] = (), seed: int = 0, valid: Any = None) -> Surrogate:
    return NoneSurrogate()


_REGISTRY: dict[str, SurrogateFactory] = {"learned": _learned, "plain-rf": _plain_rf, "none": _none}


def register_surrogate(name: str, factory: SurrogateFactory) -> None:
    _REGISTRY[name] = factory


def surrogate_names() -> list[str]:
    """Built-in and registered surrogates, and those installed packages declare (tools/plugins.py)."""
    return sorted(set(_REGISTRY) | set(plugins.names(plugins.SURROGATES, built_in=tuple(_REGISTRY))))


def make_surrogate(
    name: str, tune_params: Mapping[str, Sequence[Any]], *, priors: Sequence[PriorSource] = (), seed: int = 0,
    valid: Optional[Sequence[Sequence[Any]]] = None, for_search: bool = False,
) -> Surrogate:
    """`for_search`: the surrogate serves a search rather than a whole-space evaluation; the learned one
    then focuses on the good configurations late in the run (`LearnedSurrogate.focus_after`)."""
    if name not in _REGISTRY and name in plugins.declared(plugins.SURROGATES):  # an installed package's
        built = plugins.build(plugins.SURROGATES, name, tune_params, priors=priors, seed=seed, valid=valid)
        return plugins.CheckedSurrogate(built, name)
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown surrogate {name!r}; available: {', '.join(surrogate_names())}") from None
    if for_search and factory is _learned:
        return _learned(tune_params, priors=priors, seed=seed, valid=valid, focus_after=SEARCH_FOCUS_AFTER)
    if valid is None:  # factories registered before `valid` existed need not accept it
        return factory(tune_params, priors=priors, seed=seed)
    return factory(tune_params, priors=priors, seed=seed, valid=valid)
