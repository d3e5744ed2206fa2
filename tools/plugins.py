"""Surrogates, search policies and devices from other packages, chosen by name like the built-in ones.

A lab's own cost model or search strategy lives in its own package and declares itself with a Python entry
point, the packaging convention pytest and other tools use for plugins:

    [project.entry-points."kernelscout.surrogates"]
    roofline = "mylab.kscout_plugins:make_roofline_surrogate"

    [project.entry-points."kernelscout.policies"]
    swizzle = "mylab.kscout_plugins:SwizzlePolicy"

    [project.entry-points."kernelscout.devices"]
    lab-h100 = "mylab.kscout_plugins:LabH100"

Once that package is installed, `--surrogate roofline`, `--policy swizzle`, `--device lab-h100` and
`surrogate = "roofline"` in kscout.toml choose them, and a run made with them resumes with them. What each must provide is in the README
("Plugging in a surrogate, a policy or a device"). A plugin runs in the agent's process, as the built-in surrogates and
policies do: it is code the user installed, not candidate code, which only ever runs in sandbox workers (a device
plugin decides which machine's workers: it ships each job to `kscout slot` there, or to its own sandbox).

Built-in names win: a plugin cannot take the place of `learned` or `tuner` by declaring the same name (a search
that chooses the built-in one says, at start, that a plugin of that name is installed and not used).
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Optional

SURROGATES = "kernelscout.surrogates"
POLICIES = "kernelscout.policies"
DEVICES = "kernelscout.devices"
_KIND = {SURROGATES: "surrogate", POLICIES: "policy", DEVICES: "device"}
_CALLED_AS = {SURROGATES: "factory(tune_params, *, priors, seed, valid)", POLICIES: "factory(spec, target)",
              DEVICES: "factory(workers)"}


class PluginError(ValueError):
    """A plugin that is declared but cannot be loaded; the message names it, its package and the error."""


@functools.cache
def declared(group: str) -> dict[str, EntryPoint]:
    """Entry points of `group` in the installed packages, by name (read once per process)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def names(group: str, built_in: tuple[str, ...] = ()) -> list[str]:
    """Plugin names of `group` that do not shadow a built-in one, sorted."""
    return sorted(n for n in declared(group) if n not in built_in)


def package_of(ep: EntryPoint) -> str:
    """The distribution that declares an entry point, for messages that say which package to fix."""
    return ep.dist.name if ep.dist is not None else "an installed package"


def load(group: str, name: str) -> Callable[..., Any]:
    """The factory a plugin declares. Import errors become a PluginError that says which package to fix."""
    ep = declared(group).get(name)
    if ep is None:
        raise KeyError(name)
    try:
        factory = ep.load()
    except Exception as exc:  # any error in a third-party import; said with what to fix
        raise PluginError(f"the {_KIND.get(group, group)} {name!r} ({ep.value}, from {package_of(ep)}) could not be loaded: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise PluginError(f"the {_KIND.get(group, group)} {name!r} ({ep.value}) is not callable: an entry point in "
                          f"{group} names a factory (a class or function)")
    return factory


def build(group: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call a plugin's factory; an error in it becomes a PluginError naming the plugin and how it is called, so a
    search stops with a message (and can be resumed once the plugin is fixed) rather than a traceback."""
    factory = load(group, name)
    try:
        return factory(*args, **kwargs)
    except Exception as exc:
        raise PluginError(f"the {_KIND.get(group, group)} {name!r} ({declared(group)[name].value}) failed when made: "
                          f"{type(exc).__name__}: {exc} (it is called as {_CALLED_AS.get(group, 'factory(...)')}; README, "
                          "\"Plugging in a surrogate, a policy or a device\")") from None


class CheckedSurrogate:
    """A plugin surrogate behind the checks its callers rely on: one forecast and one P(fail) per configuration
    asked about. A wrong length otherwise surfaced as a numpy broadcast error deep in the search; here it is a
    PluginError naming the plugin, raised on the first forecast."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.plugin = inner, name
        self.name = getattr(inner, "name", name)

    def _check(self, what: str, got: Any, configs: Any) -> Any:
        n = len(configs)
        try:
            size = len(got)
        except TypeError:
            size = None
        if size != n:
            raise PluginError(f"the surrogate {self.plugin!r} returned {size if size is not None else type(got).__name__} "
                              f"values from {what}() for {n} configurations; it must give one per configuration")
        return got

    def predictive(self, configs: Any) -> Any:
        dist = self.inner.predictive(configs)
        return None if dist is None else self._check("predictive", dist, configs)

    def p_fail(self, configs: Any) -> Any:
        return self._check("p_fail", self.inner.p_fail(configs), configs)

    def __getattr__(self, attr: str) -> Any:  # update, status and anything else the plugin offers
        return getattr(self.inner, attr)


DEVICE_KINDS = ("cpu", "cuda")
BUILT_IN_DEVICE = re.compile(r"^(auto|cpu|replay|cuda(:\d+)?)$")


def is_device_plugin(name: str) -> bool:
    """Whether `--device name` names an installed package's device rather than one of this machine's."""
    return not BUILT_IN_DEVICE.match(name) and name in declared(DEVICES)


def device_names() -> list[str]:
    return sorted(n for n in declared(DEVICES) if not BUILT_IN_DEVICE.match(n))


def device_kind(name: str) -> tuple[str, Optional[str]]:
    """What a device measures on ("cpu" or "cuda" for a plugin) and its name for the speed-of-light bound (as `kscout
    sol --device` takes it; None: no bound). This machine's devices are their own answer to both. A device plugin's
    come from its factory's `device` and `gpu` attributes, so that nothing is started to learn them: the search
    decides its rewrites and its bound before it measures."""
    if not is_device_plugin(name):
        return name, name
    factory = load(DEVICES, name)
    kind, gpu = getattr(factory, "device", None), getattr(factory, "gpu", None)
    if kind not in DEVICE_KINDS:
        raise PluginError(f"the device {name!r} ({declared(DEVICES)[name].value}) must say what its workers measure on: "
                          f"a `device` attribute of 'cpu' or 'cuda' on its factory, not {kind!r}")
    return kind, (str(gpu) if gpu else None)
