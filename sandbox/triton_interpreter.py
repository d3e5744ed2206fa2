"""Triton without a GPU: what ran under the CPU interpreter, and what to tell the user when it fails.

On a CPU the sandbox sets TRITON_INTERPRET=1, so a Triton kernel runs as Python, one program instance
at a time: its outputs can be checked, its time says nothing about a GPU. Whether a measurement
involves the interpreter cannot be read from the files: a problem's reference may be the Triton
kernel, a candidate may reach Triton through importlib, or import it and launch nothing on a CPU
tensor. So the worker counts the launches each side actually makes (`LaunchCounter`), and the
harness decides from the counts. A candidate that hid its own launches would only be timed in the
interpreter, far slower; the reference's count comes from the problem, which is trusted.

The interpreter also turns the errors a GPU build would report into exceptions at the first launch,
does not check bounds, and cannot run the autotuner; the hints below say so where the user meets it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

REASON = (
    "Triton ran under its CPU interpreter (TRITON_INTERPRET=1, no GPU here): the outputs were checked, "
    "timing is meaningless and was skipped; the interpreter checks neither bounds nor GPU limits "
    "(such as tl.dot's 16-wide minimum), so a GPU measurement is still the real test"
)
REFERENCE_REASON = (
    "the problem's reference runs Triton kernels under the CPU interpreter (TRITON_INTERPRET=1, no GPU here): "
    "a speedup over it would compare interpreted Python with native code, so timing was skipped; "
    "the outputs were checked"
)
CRASH_HINT = ("Triton's CPU interpreter does not check bounds: an unmasked tl.load or tl.store past a tensor's end "
              "corrupts the worker's memory; check the masks")
TIMEOUT_HINT = ("Triton's CPU interpreter runs every program instance as Python: give the problem smaller inputs "
                "or each program more elements, or allow more with --timeout")
AUTOTUNE_HINT = ("Triton's autotuner times its configurations on a GPU, which the CPU interpreter cannot do; "
                 "for a check on the CPU launch one configuration (the autotuned kernel's .fn with fixed "
                 "meta-parameters) when the inputs are not on CUDA")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class LaunchCounter:
    """Counts interpreted grid launches, per side of the measurement (`side` is set by the worker)."""

    def __init__(self) -> None:
        self.side: Optional[str] = None
        self.counts = {"ref": 0, "cand": 0}
        self._watching = False

    def watch(self) -> None:
        """Start counting once Triton's interpreter is imported (it is, with any kernel defined under
        TRITON_INTERPRET=1); call again after code that may have imported it."""
        if self._watching or not interpreting():
            return
        module = sys.modules.get("triton.runtime.interpreter")
        executor = getattr(module, "GridExecutor", None) if module is not None else None
        if executor is None:
            return
        launch: Callable[..., Any] = executor.__call__
        counter = self

        def counted_launch(grid_executor: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.side is not None:
                counter.counts[counter.side] += 1
            return launch(grid_executor, *args, **kwargs)

        executor.__call__ = counted_launch
        self._watching = True


def is_build_error(exc: BaseException) -> bool:
    """A Triton kernel that would not compile on a GPU: CompilationError there; under the interpreter,
    the InterpreterError that wraps whatever the kernel's body raised at its first launch."""
    return type(exc).__module__.startswith("triton") and type(exc).__name__ in ("CompilationError", "InterpreterError")


def runtime_hint(exc: BaseException) -> str:
    """A line to add to a runtime error that the interpreter, not the kernel, explains."""
    if interpreting() and "active drivers" in str(exc):
        return "\n  hint: " + AUTOTUNE_HINT
    return ""
