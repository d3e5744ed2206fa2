"""kernelscout: faster GPU kernels for fewer real measurements.

The code lives in the top-level folders agent/, tools/ and sandbox/ of the
repository; they are installed as the subpackages ``kernelscout.agent``,
``kernelscout.tools`` and ``kernelscout.sandbox`` so that nothing generic like
``tools`` lands at the top of site-packages.

The names below are the Python face of the same tools the CLI and the MCP server adapt, for a
notebook or a script::

    import kernelscout as ks

    m = ks.measure(ks.MeasureRequest(problem="examples/softmax/problem.py",
                                     candidate="examples/softmax/fast.py", run_dir="runs/nb", budget=5))
    f = ks.predict(ks.PredictFileRequest(problem="examples/softmax/problem.py", candidate="examples/softmax/fast.py",
                                         run_dir="runs/nb"))  # an LLM's forecast, or one that says it has none
    result = ks.optimize("examples/softmax", budget=10)
    view = ks.show(result.run_dir)

They load on first use, so ``import kernelscout`` stays cheap (no torch until a tool needs it).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_API = {
    "measure": ("kernelscout.tools.measure", "measure"),
    "MeasureRequest": ("kernelscout.tools.measure", "MeasureRequest"),
    "Measurement": ("kernelscout.tools.schema", "Measurement"),
    "predict": ("kernelscout.tools.predict_file", "predict"),
    "PredictFileRequest": ("kernelscout.tools.predict_file", "PredictFileRequest"),
    "sol_bounds": ("kernelscout.tools.sol", "sol_bounds"),
    "SolRequest": ("kernelscout.tools.sol", "SolRequest"),
    "Budget": ("kernelscout.tools.budget", "Budget"),
    "RunDir": ("kernelscout.tools.rundir", "RunDir"),
    "open_run": ("kernelscout.agent.run_view", "open_run"),
    "Archive": ("kernelscout.tools.archive", "Archive"),
    "check_forecasts": ("kernelscout.agent.python_face", "check_forecasts"),
    "optimize": ("kernelscout.agent.python_face", "optimize"),
    "resume": ("kernelscout.agent.python_face", "resume"),
    "show": ("kernelscout.agent.run_view", "view_run"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'kernelscout' has no attribute {name!r}")
    module, attribute = _API[name]
    value = getattr(import_module(module), attribute)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
