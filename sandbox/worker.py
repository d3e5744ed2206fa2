"""The sandbox worker: the only process that imports problem and candidate code.

Started by the supervisor (sandbox/pool.py) with ``python -m kernelscout.sandbox.worker CMD_FD RES_FD``,
or forked from the zygote (sandbox/zygote.py), which imported this module and calls `main` in each
child; never forked from a process holding secrets or one that ran a candidate, with a scrubbed environment, its own
process group, a memory limit and a temporary working directory. Commands and replies travel as
JSON over two private pipes; stdout and stderr go to a log file, so a candidate that prints a fake
result only writes to the log.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import random
import resource
import sys
import time
import traceback
from typing import Any, Callable, Optional

from kernelscout.sandbox import protocol


def apply_limits() -> None:
    """At import, and again in a worker forked from the zygote (sandbox/launcher.py), which imported this
    module before it had a worker's environment."""
    limit = int(os.environ.get("KSCOUT_WORKER_MEMORY_BYTES", "0"))
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


apply_limits()

import torch  # noqa: E402  (after the limits, so torch's own allocations count)

from kernelscout.sandbox import build_errors, build_lock, correctness, exact_reference, integrity, triton_interpreter  # noqa: E402
from kernelscout.sandbox.correctness import CheckFailed  # noqa: E402
from kernelscout.sandbox.timing import CallTimer  # noqa: E402


class Failure(Exception):
    def __init__(self, status: str, message: str, **extra: Any):
        super().__init__(message)
        self.status = status
        self.extra = extra


def _sibling_hint(exc: BaseException, msg: dict, what: str) -> str:
    """A failed import of a file that sits beside the user's (the supervisor lists them): say that it cannot work."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing and missing.split(".")[0] + ".py" in msg.get("siblings", ()):
        name = missing.split(".")[0]
        return (f" (a {what} is one self-contained file, as in KernelBench: {name}.py next to it is not importable in the "
                f"sandbox, which gets a copy of the {what} alone; put its code into the {what})")
    return ""


def _short_error(exc: BaseException, source_path: Optional[str] = None) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 3000:
        text = text[:1500] + "\n...\n" + text[-1500:]
    return text + (_where(exc, source_path) if source_path else "")


def _where(exc: BaseException, source_path: str) -> str:
    """The candidate's (or problem's) own line where the error passed through it, if it did."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == source_path]
    return f"\n  at {os.path.basename(source_path)} line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower()


def _import_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _each_tensor(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`fn` applied to every tensor, also inside lists, tuples and dicts (an argument may be a list of
    tensors, or a dict of state); everything else is passed through."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (list, tuple):  # not subclasses such as named tuples: those pass through whole
        return type(value)(_each_tensor(v, fn) for v in value)
    if type(value) is dict:
        return {k: _each_tensor(v, fn) for k, v in value.items()}
    return value


def tensors_in(values: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _each_tensor(values, found.append)
    return found


def _to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [_each_tensor(v, lambda t: t.to(device)) for v in values]


def _clone(values: list[Any]) -> list[Any]:
    """Deep for tensors: a tensor inside a list argument must not be shared by candidate and reference."""
    return [_each_tensor(v, torch.Tensor.clone) for v in values]


def _refill(buffers: Optional[list[Any]], fresh: list[Any]) -> list[Any]:
    """Copy fresh values into the same tensors as last round.

    The addresses and tensor objects stay the same while the contents change, so a candidate that
    caches results by data_ptr() or id() always hits a stale entry, and the re-check catches it.
    """
    if buffers is None or len(buffers) != len(fresh):
        return _clone(fresh)
    return [_refill_one(old, new) for old, new in zip(buffers, fresh)]


def _layout(buffers: list[Any]) -> list[tuple]:
    """What the round's input tensors must still be at the next refill. Their exact class too: a review's
    candidate reached the reference's inputs (gc) and gave them a subclass whose __torch_function__ made
    every op of the reference slow or run in float64 (softmax 6.9x, layernorm 19.9x)."""
    return [(type(t), t.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors_in(buffers)]


def _refill_one(old: Any, new: Any) -> Any:
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device:
        old.copy_(new)
        return old
    if type(old) in (list, tuple) and type(new) is type(old) and len(old) == len(new):
        return type(new)(_refill_one(o, n) for o, n in zip(old, new))
    if type(old) is dict and type(new) is dict and list(old) == list(new):
        return {k: _refill_one(old[k], new[k]) for k in new}
    return _each_tensor(new, torch.Tensor.clone)


def _checksum(t: torch.Tensor) -> Any:
    if t.is_complex():
        t = torch.view_as_real(t)
    v = float(t.detach().double().sum()) if t.numel() else 0.0
    return v if v == v else "nan"


# values per tensor that the supervisor keeps of a round's inputs and outputs (`sample`): a change to a share f of a tensor
# escapes one sample with chance (1 - f)^64, and a fake answer must change nearly all of it. 256 cost 0.6 ms a call on
# this CPU, most of it the JSON of the values
SAMPLE_POINTS = 64


def sample(tensors: list[torch.Tensor], key: Optional[int]) -> Optional[list[list[Any]]]:
    """The values at SAMPLE_POINTS positions of each tensor, drawn from `key` (None: no key, no sample).

    What the supervisor holds of a round: the inputs as the refill made them, each side's inputs as its call
    began and its outputs as its call returned. Anything in this process can be reached by the candidate's code
    (a review's candidate walked up from its own call to the worker's frame, and in the rounds where it ran
    second wrote its zeros into the reference's outputs, so that the re-check compared zeros with zeros: softmax
    2.0x, correct). The key for a side comes only with that side's own call, so a candidate knows the positions
    of its own sample, never of the reference's; a change to the reference's values that could fool the check
    would have to spare every one of its positions."""
    if key is None:
        return None
    gen = torch.Generator().manual_seed(key)
    out = []
    for t in tensors:
        n = t.numel()
        if n == 0:
            out.append([])
            continue
        flat = torch.randint(n, (min(n, SAMPLE_POINTS),), generator=gen)
        t = t.detach()
        if t.is_contiguous():
            picked = t.reshape(-1).index_select(0, flat.to(t.device))
        else:
            picked = t[tuple(i.to(t.device) for i in torch.unravel_index(flat, t.shape))]
        if picked.is_complex():
            picked = torch.view_as_real(picked)
        if picked.is_floating_point():
            picked = picked.double()
        out.append(picked.flatten().cpu().tolist())
    return out


def _perturb(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` scaled by random factors in [1 - 2^-6, 1), one per index of every axis: positive and at most
    1, so signs, zeros and bounds such as [0, 1] hold, and a (batch of) square matrices gets D·A·D on its
    last two axes, which keeps symmetry and definiteness. Unlike one factor for the whole tensor, or
    factors on the outer axes only, a cached output cannot be rescaled into the new one: a red-team
    candidate undid first-and-last-axis factors on a reduction over a middle axis (masked_mean), whose
    output they only rescale."""
    if t.dim() == 0 or t.numel() == 0:
        return t * (1.0 - float(torch.rand((), generator=gen)) / 64)

    def factors(n: int) -> torch.Tensor:
        return (1.0 - torch.rand(n, generator=gen, dtype=torch.float64) / 64).to(device=t.device, dtype=t.dtype)

    out = t
    previous = None
    for axis, n in enumerate(t.shape):
        square = axis == t.dim() - 1 and axis > 0 and n == t.shape[axis - 1]
        f = previous if square else factors(n)
        out = out * f.view(*([1] * axis), -1, *([1] * (t.dim() - axis - 1)))
        previous = f
    return out


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_module_registration_hooks", "_global_parameter_registration_hooks",
                 "_global_buffer_registration_hooks")


def _module_fingerprint(model: Any, weights: bool = True) -> tuple:
    """What makes the reference compute what it computes, short of its buffers: the class and the
    attributes of it and every submodule (an instance-level forward override, a swapped `__class__`
    or a changed `eps` shows), their forward hooks and torch's global module hooks (a hook can slow
    or change the reference without touching it), and, with `weights`, a checksum of every parameter
    (zeroed weights would make zeros correct). Buffers are left out: BatchNorm in training mode
    updates its running stats itself."""
    if not isinstance(model, torch.nn.Module):
        return ()

    def attributes(m: torch.nn.Module) -> tuple:
        return tuple(sorted((k, repr(v) if isinstance(v, (int, float, str, bool, type(None))) else (id(v), type(v)))
                            for k, v in vars(m).items() if not k.startswith("_")))

    def hooks(m: torch.nn.Module) -> tuple:
        return tuple(tuple(getattr(m, h, {}).items()) for h in _HOOK_DICTS)

    subs = tuple((name, id(m), type(m), attributes(m), hooks(m)) for name, m in model.named_modules())
    # the exact class of every parameter and buffer: a review's candidate gave one of the reference's
    # parameters a subclass whose __torch_function__ slept in every op it took part in (layernorm 8.5x)
    tensors = tuple((name, type(t)) for name, t in (*model.named_parameters(), *model.named_buffers()))
    subs = (subs, tensors)
    if not weights:
        return (subs,)  # a prefix of the full fingerprint
    with torch.no_grad():
        sums = tuple((name, t.data_ptr(), _checksum(t)) for name, t in model.named_parameters())
    return subs, sums


def _global_module_hooks() -> tuple:
    """torch's process-wide module hooks: one registered by the candidate runs inside the reference."""
    module_globals = torch.nn.modules.module
    return tuple(tuple(getattr(module_globals, h, {}).items()) for h in _GLOBAL_HOOKS)


def _strided_hint(message: str, inputs: list[Any]) -> str:
    """For wrong values: the non-contiguous inputs, a usual cause in a kernel that indexes raw memory."""
    if " differs " not in message:
        return ""
    strided = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and not t.is_contiguous()]
    if not strided:
        return ""
    which = ", ".join(f"{i} (strides {tuple(inputs[i].stride())})" for i in strided[:3])
    return (f"; note: input tensor {which} is not contiguous, and a kernel that indexes its memory as if it were "
            "reads the wrong elements (call .contiguous() first, or use the strides)")


_GPU_ONLY = frozenset({"cupy", "cupyx", "pycuda", "cuda"})  # packages whose kernels need a CUDA device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        integrity.cuda_synchronize()


class Worker:
    def __init__(self) -> None:
        self.device = torch.device(os.environ.get("KSCOUT_DEVICE", "cpu"))
        threads = int(os.environ.get("KSCOUT_THREADS", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        integrity.pin_precision()
        integrity.install_library_patches()
        build_lock.install()  # a build killed in the shared cache does not stall the next one
        self.own_settings = integrity.shared_settings()  # the worker's own, put back before a problem loads
        # what each candidate is loaded under, and the hooks it may not change: the worker's own, plus
        # what the problem file chose at import (load_problem), so a problem's choice is not the candidate's
        self.initial_settings, self.initial_hooks = self.own_settings, integrity.code_hooks()
        self.memory_limit = int(os.environ.get("KSCOUT_WORKER_MEMORY_BYTES", "0"))
        self.timer = CallTimer(self.device)
        self.problem = None
        self.problem_path: Optional[str] = None
        self.problem_sha: Optional[str] = None
        self.output_specs: list = []  # [shape, dtype, bytes] of each of the reference's outputs
        self.reference = None
        self.candidate = None
        self.candidate_path: Optional[str] = None
        self.candidate_module: Optional[str] = None
        self.snapshot: Optional[dict] = None
        self.threads_before_candidate: set[int] = set()
        self.tasks_before_candidate: Optional[set[str]] = None
        self.thread_baseline: Optional[int] = None
        self.thread_cpu_at_timing: Optional[dict[int, Optional[float]]] = None
        self.timed_candidate_ms = 0.0
        self.children_cpu_at_timing: Optional[float] = None  # CPU seconds of reaped children when timing began
        self.settings_at_load: Optional[dict[str, Any]] = None  # integrity.shared_settings() once both models are built
        self.round: dict[str, Any] = {}
        self.inputs_rescaled = False  # this round's inputs are a kept set rescaled (`_fresh_inputs`), not get_inputs()'s own
        self.gc_held: Optional[bool] = None  # whether automatic gc was on before the timing rounds switched it off
        self.built: Optional[tuple] = None  # (reference, candidate, timer) as load_candidate made them
        self.reference_print: tuple = ()  # _module_fingerprint of the reference as built: (structure, weights)
        self.global_hooks: tuple = ()
        self.kernels: dict[str, int] = {}  # integrity.kernel_tables() once the problem is loaded
        self.reference_faults = 0  # page faults of the reference's repeat call at load (`_check_repeatable`)
        self.reference_call_s = 0.0  # wall time of that call: the supervisor allows for the reference's calls with it
        self.reference_aliases: frozenset = frozenset()  # (output, input) pairs where the reference returns its input
        self.judge: Optional[integrity.Judge] = None  # what the output check calls, as the problem left it
        self.reference_kernels: dict[str, int] = {}  # the same for the operators the reference calls
        self.triton = triton_interpreter.LaunchCounter()  # Triton kernels each side ran under the CPU interpreter

    # -- problem -----------------------------------------------------------------------------
    def load_problem(self, msg: dict) -> dict:
        path, sha = msg["path"], msg["sha"]
        if self.problem_sha == sha:
            return {"status": "ok", "cached": True, "reference_faults": self.reference_faults, "outputs": self.output_specs,
                    "reference_call_s": self.reference_call_s}
        integrity.restore_settings(self.own_settings)  # not what a candidate of another problem left
        try:
            module = _import_file(path, f"kscout_problem_{sha[:16]}")
        except Exception as exc:
            raise Failure("invalid_problem", f"{path}: importing the problem failed: {_short_error(exc, path)}"
                          f"{_sibling_hint(exc, msg, 'problem')}")
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise Failure("invalid_problem", f"{path}: defines no {name}")
        self._init_inputs(module, msg["seeds"][0], path)  # a problem that cannot say them fails here, before the inputs
        self._check_input_size(module, path)
        per_seed_outputs, input_scale = [], 0.0
        recorder = integrity.OpRecorder() if integrity.OpRecorder is not None else None  # on the first seed's call
        input_prints = []  # whether get_inputs() gave the same inputs for every seed
        for seed in msg["seeds"]:
            inputs = self._make_inputs(module, seed, path)
            input_prints.append(correctness.fingerprint(tensors_in(inputs)))
            input_scale = max(input_scale, correctness.finite_input_scale(tensors_in(inputs)))  # a -inf mask is not the scale
            torch.manual_seed(seed)
            model = self._build(module, module.Model, msg["seeds"][0], path, "Model")
            try:
                with torch.no_grad(), (recorder if recorder is not None and not per_seed_outputs else contextlib.nullcontext()):
                    out = model(*inputs)
                _sync(self.device)
            except Exception as exc:
                kind = "does not fit in memory" if _is_oom(exc) else "raised"
                raise Failure("invalid_problem", f"{path}: the reference Model {kind}: {_short_error(exc, path)}")
            try:
                per_seed_outputs.append([o.detach() for o in correctness.flatten_outputs(out, "reference")])
            except CheckFailed as exc:
                raise Failure("invalid_problem", f"{path}: {exc}")
            if len(per_seed_outputs) == 1:
                aliases = correctness.aliased_inputs(per_seed_outputs[0], tensors_in(inputs))
        weak = correctness.weak_reference_reason(per_seed_outputs, input_scale)
        if weak and len(input_prints) > 1 and all(p == input_prints[0] for p in input_prints[1:]):
            weak = (f"get_inputs() returns the same inputs whatever the seed (it calls torch.manual_seed, or makes them without "
                    f"torch's random functions), so {weak}. The harness seeds torch before each call and checks candidates "
                    "on several random inputs: let it, by leaving the seeding out of get_inputs()")
        if weak:
            raise Failure("invalid_problem", f"{path}: too weak to check candidates: {weak}")
        self._check_repeatable(module, model, msg["seeds"][0], per_seed_outputs[0], path)
        self.problem, self.problem_path, self.problem_sha = module, path, sha
        self.reference_aliases = aliases
        self.initial_settings, self.initial_hooks = integrity.shared_settings(), integrity.code_hooks()
        # torch's kernels as the problem left them: all of aten (checked once the candidate is imported)
        # and the reference's own operators (checked after every candidate call)
        self.kernels = integrity.kernel_tables()
        self.reference_kernels = integrity.kernel_subset(recorder.ops, self.kernels) if recorder is not None else {}
        self.judge = self._make_judge(per_seed_outputs[0], tensors_in(inputs), self.kernels)
        self.output_specs = [[list(o.shape), str(o.dtype), o.numel() * o.element_size()] for o in per_seed_outputs[0]]
        return {
            "status": "ok",
            "outputs": self.output_specs,
            "reference_faults": self.reference_faults,
            "reference_call_s": self.reference_call_s,
        }

    @staticmethod
    def _make_judge(outputs: list[torch.Tensor], inputs: list[torch.Tensor], kernels: dict[str, int]) -> integrity.Judge:
        """The output check's own operators, recorded by running it on the reference's output against a copy
        (and the inputs against theirs), before any candidate exists; `kernels` are all of aten's, just read."""
        recorder = integrity.OpRecorder() if integrity.OpRecorder is not None else None
        if recorder is None:
            return integrity.Judge(set(), kernels)
        # a few elements of each, same dtypes: which operators run depends on the dtype, not the size, and a
        # full copy of a large problem's tensors (and their float64 versions in the check) would cost memory
        outputs, inputs = [o.reshape(-1)[:64] for o in outputs], [t.reshape(-1)[:64] for t in inputs]
        try:
            with torch.no_grad(), recorder:
                correctness.compare([o.clone() for o in outputs], outputs)
                correctness.check_inputs_kept([t.clone() for t in inputs], inputs)
        except CheckFailed:  # not expected of equal copies; what ran up to here is recorded all the same
            pass
        return integrity.Judge(recorder.ops, kernels)

    def _judge_intact(self, deep: bool = True) -> None:
        """Before every comparison: the candidate's code must not sit inside the check of its own output."""
        changes = self.judge.changes(deep) if self.judge is not None else []
        if changes:
            raise Failure("incorrect", "the candidate changed what checks its output: " + ", ".join(changes))

    def _check_repeatable(self, module, model, seed: int, first: list[torch.Tensor], path: str) -> None:
        """The reference again on the first trial's inputs, with the random generators elsewhere: a forward
        that draws random numbers (dropout left in training mode, torch.rand) or keeps state between calls
        answers differently, so no candidate could ever be judged correct against it. Refused here, before
        a search spends its budget on candidates that all come back incorrect. Costs one more forward."""
        inputs = self._make_inputs(module, seed, path)
        torch.manual_seed(seed ^ 0x5DEECE66D)
        try:
            faults, started = integrity.page_faults(), time.perf_counter()
            with torch.no_grad():
                out = model(*inputs)
            _sync(self.device)
            self.reference_call_s = time.perf_counter() - started
            # a warm reference reuses its temporaries' memory: what it faults in here, before any candidate
            # exists, is what it needs afresh every call (blocks above the allocator's 1 GiB threshold)
            self.reference_faults = integrity.page_faults() - faults
            again = correctness.flatten_outputs(out, "reference")
            correctness.compare(again, first)
        except CheckFailed as exc:
            raise Failure("invalid_problem", f"{path}: the reference Model gives different outputs for the same inputs (a second call against the first: {exc}), "
                          "so no candidate can be checked against it. Make its forward deterministic: a Model with dropout "
                          "should call self.eval() in __init__ (or use p=0), and it should not draw random numbers or keep state "
                          "between calls")
        except Exception as exc:
            raise Failure("invalid_problem", f"{path}: the reference Model raised when called a second time: {_short_error(exc, path)}")

    def _call_problem(self, fn: Callable, path: str, what: str) -> Any:
        try:
            return fn()
        except Exception as exc:
            if _is_oom(exc):
                raise Failure("invalid_problem", f"{path}: {what} does not fit in memory: {_short_error(exc)}")
            raise Failure("invalid_problem", f"{path}: {what} raised {_short_error(exc, path)}")

    def _check_input_size(self, module, path: str) -> None:
        """Size the inputs on the meta device first, so an impossible problem fails without allocating."""
        try:
            with torch.device("meta"):
                meta_inputs = module.get_inputs()
            needed = correctness.tensor_bytes(tensors_in(list(meta_inputs)))
        except Exception:
            return
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            limit, where = free, "free GPU memory"
        else:
            limit, where = self.memory_limit, "the worker's memory limit"
        if limit and 3 * needed > limit:
            raise Failure(
                "invalid_problem",
                f"{path}: get_inputs() makes {correctness.describe_bytes(needed)} of tensors; with a copy for the candidate "
                f"and the outputs that does not fit in {where} ({correctness.describe_bytes(limit)}). "
                "Shrink the shapes (a CPU worker may use 3/4 of the machine's memory, at most 64 GiB).",
            )

    def _make_inputs(self, module, seed: int, path: str) -> list[Any]:
        torch.manual_seed(seed)
        # numpy's and Python's generators too: a get_inputs() that draws from them (np.random.randn) gives the same
        # inputs for the same seed, else its reference could never be checked twice on the same inputs
        random.seed(seed)
        if (np := sys.modules.get("numpy")) is not None:
            np.random.seed(seed % 2**32)
        inputs = self._call_problem(module.get_inputs, path, "get_inputs()")
        if not isinstance(inputs, (list, tuple)):
            raise Failure("invalid_problem", f"{path}: get_inputs() must return a list of tensors, got {type(inputs).__name__}")
        inputs = list(inputs)
        if not tensors_in(inputs):
            kinds = ", ".join(type(x).__name__ for x in inputs) or "an empty list"
            raise Failure("invalid_problem", f"{path}: get_inputs() must return tensors, got {kinds}")
        try:
            return _to_device(inputs, self.device)
        except Exception as exc:
            raise Failure("invalid_problem", f"{path}: moving the inputs to {self.device} failed: {_short_error(exc)}")

    def _init_inputs(self, module, seed: int, path: str) -> list[Any]:
        """get_init_inputs() under the model's seed: a tensor among them (weights, a projection) is then the
        same in every worker, the referee's included, where an unseeded call drew other values in each."""
        torch.manual_seed(seed)
        init_inputs = self._call_problem(module.get_init_inputs, path, "get_init_inputs()")
        if not isinstance(init_inputs, (list, tuple)):
            raise Failure("invalid_problem", f"{path}: get_init_inputs() must return a list, got {type(init_inputs).__name__}")
        return list(init_inputs)

    def _build(self, module, cls, seed: int, path: str, what: str):
        """`cls` built from fresh init inputs of `module` (the problem), so the reference and the candidate
        never share a tensor that one of their constructors could change for the other."""
        init_inputs = self._init_inputs(module, seed, path)
        torch.manual_seed(seed)
        try:
            return cls(*init_inputs).to(self.device)
        except Exception as exc:
            status = "invalid_problem" if what == "Model" else "compile_error"
            raise Failure(status, f"{path}: constructing {what} failed: {_short_error(exc, path)}")

    # -- candidate ---------------------------------------------------------------------------
    def load_candidate(self, msg: dict) -> dict:
        if self.problem is None:
            raise Failure("crashed", "load_problem must come first")
        path = msg["path"]
        integrity.restore_settings(self.initial_settings)  # as the last candidate in this worker may have left them
        if msg.get("count_flops"):  # before the snapshot, so that it covers torch's flop registry and the counter
            from kernelscout.sandbox import flop_count  # noqa: F401
        self.snapshot = integrity.snapshot()
        self.global_hooks = _global_module_hooks()
        self.threads_before_candidate = {t.ident for t in integrity.list_threads()}
        self.tasks_before_candidate = integrity.os_thread_ids()
        self.thread_baseline = None
        self.thread_cpu_at_timing = None
        self.timed_candidate_ms = 0.0
        self.children_cpu_at_timing = None
        self.settings_at_load = None
        integrity.refuse_audit_hooks()
        name = f"kscout_candidate_{msg['sha'][:16]}_{os.getpid()}"
        try:
            module = _import_file(path, name)
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                raise Failure("compile_error", f"{path}: the candidate called sys.exit() while being imported")
            hint = _sibling_hint(exc, msg, "candidate")
            missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
            if not hint and missing and missing.split(".")[0] in _GPU_ONLY and self.device.type != "cuda":
                hint = (f" ({missing.split('.')[0]} runs only on a CUDA GPU, and this measurement is on {self.device.type}: "
                        "measure it with --device cuda on a machine that has one)")
            if build_errors.is_build_error(exc):
                with open(path) as f:
                    told = build_errors.summarise(str(exc), f.read(), path)
                raise Failure("compile_error", f"{path}: {told}{_where(exc, path)}")
            raise Failure("compile_error", f"{path}: importing the candidate failed: {_short_error(exc, path)}{hint}")
        self.candidate_module, self.candidate_path = name, path
        if not hasattr(module, "ModelNew"):
            raise Failure("compile_error", f"{path}: defines no class ModelNew")
        seed = msg["init_seed"]
        self.reference = self._build(self.problem, self.problem.Model, seed, self.problem_path, "Model")
        self.reference_print = _module_fingerprint(self.reference)
        self.candidate = self._build(self.problem, module.ModelNew, seed, path, "ModelNew")
        self.built = (self.reference, self.candidate, self.timer)
        # after the candidate's import and constructor, before its first call: a setting it chose there
        # (cudnn.benchmark, say) holds for both sides alike; one its calls flip would not. How many cores
        # the reference runs on is not the candidate's to choose, so those are put back and named.
        now = integrity.shared_settings()
        reset = {k: v for k, v in self.initial_settings.items() if integrity.is_parallelism(k) and now.get(k) != v}
        if reset:
            integrity.restore_settings(reset)
        self.settings_at_load = integrity.shared_settings() if reset else now
        tampered = integrity.changed_since(self.snapshot) + self._reference_tampering()
        tampered += [f"torch's kernel for {op} was replaced" for op in integrity.kernels_replaced(self.kernels)]
        return {"status": "ok", "tampered": tampered, "triton": "triton" in sys.modules,
                "reset": [f"{k} from {now[k]} back to {v}" for k, v in reset.items()]}

    def _tampered_now(self, kernels: bool = True) -> list[str]:
        """Everything `unload` reads, read mid-measurement (re-checks, the referee's `emit`): a patch the candidate
        puts in place for its timed rounds and takes away before it is unloaded (a review's candidate replaced the
        problem's `Model.forward` during timing and put it back when asked to emit: softmax 60.8x, correct, with zeros)
        must be in place at one of them."""
        tampered = integrity.changed_since(self.snapshot) if self.snapshot else []
        tampered += self._reference_tampering() if self.built else []
        if not kernels:  # every table is ~40 ms; the reference's own kernels are read after every call (`_hooks_changed`)
            return tampered
        return tampered + [f"torch's kernel for {op} was replaced" for op in integrity.kernels_replaced(self.kernels)]

    def _reference_tampering(self, weights: bool = True) -> list[str]:
        """What the candidate changed in the objects it is judged against: the worker's reference,
        candidate and timer (reachable through frames or gc), the reference's own attributes and
        forward, and its weights (zeroed weights would make zeros correct)."""
        changes = []
        for what, now, then in zip(("reference", "candidate", "timer"), (self.reference, self.candidate, self.timer), self.built):
            if now is not then:
                changes.append(f"the worker's {what} object was replaced")
        if _global_module_hooks() != self.global_hooks:
            changes.append("a global nn.Module hook was registered (it would run inside the reference too)")
        if self.reference is not None:
            now = _module_fingerprint(self.reference, weights)
            if now != (self.reference_print if weights else self.reference_print[:1]):
                changes.append("the reference model's attributes or weights were changed" if weights
                               else "the reference model's attributes were changed")
        return changes

    def _run_candidate(self, inputs: list[Any]) -> list[torch.Tensor]:
        try:
            with torch.no_grad():
                out = self.candidate(*inputs)
        except Exception as exc:
            if triton_interpreter.is_build_error(exc):  # Triton builds a kernel at its first launch
                # the interpreter's error points at the launch; the error it wraps, at the kernel's own line
                inner = exc.__cause__ if exc.__cause__ is not None else exc
                where = _where(inner, self.candidate_path or "") or _where(exc, self.candidate_path or "")
                raise Failure("compile_error", f"the candidate's Triton kernel does not build: {_short_error(exc)}{where}")
            raise Failure("runtime_error", self._runtime_message(exc))
        return self._validate_candidate_output(out, inputs)

    def _runtime_message(self, exc: BaseException) -> str:
        if _is_oom(exc):
            limit = correctness.describe_bytes(self.memory_limit) if self.memory_limit else "the device memory"
            return f"the candidate ran out of memory (limit {limit}): {_short_error(exc, self.candidate_path)}"
        return f"the candidate raised {_short_error(exc, self.candidate_path)}" + triton_interpreter.runtime_hint(exc)

    def _validate_candidate_output(self, out: Any, inputs: list[Any]) -> list[torch.Tensor]:
        try:
            outputs = correctness.flatten_outputs(out, "candidate")
        except CheckFailed as exc:
            raise Failure("incorrect", str(exc))
        problem = self._aliases_and_flags(outputs, inputs)
        if problem:
            raise Failure("incorrect", problem)
        return outputs

    def _aliases_and_flags(self, outputs: list[torch.Tensor], inputs: list[Any]) -> Optional[str]:
        """What is wrong with a candidate's outputs beyond their values: one that is an input the reference does
        not return, or precision flags its call changed (also run after the reference's timed calls, whose
        answer is not used, so that both sides' calls are followed by the same work)."""
        try:
            correctness.check_no_alias(outputs, tensors_in(inputs), self.reference_aliases)
        except CheckFailed as exc:
            return str(exc)
        if integrity.precision_flags() != self._pinned_flags():
            integrity.pin_precision()
            return "the candidate changed the TF32/reduced-precision flags (a precision downgrade)"
        return None

    @staticmethod
    def _pinned_flags() -> dict:
        return {
            "matmul.allow_tf32": False,
            "cudnn.allow_tf32": False,
            "float32_matmul_precision": "highest",
            "matmul.allow_fp16_reduced_precision_reduction": False,
            "matmul.allow_bf16_reduced_precision_reduction": False,
        }

    def _run_reference(self, inputs: list[Any]) -> list[torch.Tensor]:
        integrity.pin_precision()
        hooked = self._hooks_changed()
        if hooked:  # a function mode or a profile hook could rewrite what the reference computes
            raise Failure("incorrect", hooked)
        with torch.no_grad():
            out = self.reference(*inputs)
        outs = correctness.flatten_outputs(out, "reference")
        dtypes = [str(o.dtype) for o in outs]
        if self.output_specs and dtypes != [spec[1] for spec in self.output_specs]:
            # whatever state did it (autocast was one), the output check would judge against another dtype's tolerance
            raise Failure("incorrect", f"the reference's outputs came out as {', '.join(dtypes)}, not as "
                                       f"{', '.join(spec[1] for spec in self.output_specs)} when the problem loaded before any "
                                       "candidate: something the candidate changed altered what the reference computes")
        return outs

    def _inputs_for(self, seed: int) -> Callable[[], list[Any]]:
        """The problem's inputs for `seed`, made afresh on each call: as they were before either side's call."""
        return lambda: self._make_inputs(self.problem, seed, self.problem_path)

    def _exact(self, inputs: Callable[[], list[Any]], on_cpu: bool = False) -> Callable[[], Optional[list[torch.Tensor]]]:
        """What `correctness.judge` calls, only when a candidate fails: the reference run in float64, on a fresh copy of
        the model checked against the live one (sandbox/exact_reference.py; never a copy kept between calls, where a
        candidate could reach and change it) and float64 copies of the inputs as they were before any call. None when
        the reference cannot run so (a model that does not copy, or a forward that insists on its dtype): the first
        verdict then stands. The checks that guard the reference's own call come first."""

        def run() -> Optional[list[torch.Tensor]]:
            hooked = self._hooks_changed()
            if hooked:
                raise Failure("incorrect", hooked)
            self._judge_intact()
            integrity.pin_precision()
            try:
                model = exact_reference.widened(self.reference)
                if model is None:
                    return None
                args = [_each_tensor(x, exact_reference.in_float64) for x in inputs()]
                with self._side("ref"), torch.no_grad():
                    out = model(*args)
                _sync(self.device)
                outputs = correctness.flatten_outputs(out, "reference")
            except Exception:
                return None
            finally:
                model = args = out = None
            self._judge_intact()  # and after: what the float64 run went through must still be as the comparison found it
            if on_cpu:  # the referee compares on the CPU
                outputs = correctness.from_portable(correctness.portable(outputs), "reference")
            return outputs

        return run

    def check(self, msg: dict) -> dict:
        """Correctness trials: fresh seed and inputs each; the candidate runs first, on its own copy."""
        worst = correctness.Comparison()
        self.triton.counts = {"ref": 0, "cand": 0}  # this candidate's trials only (a test pool reuses workers)
        for seed in msg["seeds"]:
            ref_inputs = self._make_inputs(self.problem, seed, self.problem_path)
            cand_inputs = _clone(ref_inputs)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            with self._side("cand"):
                cand_out = self._run_candidate(cand_inputs)
                _sync(self.device)
            with self._side("ref"):
                ref_out = self._run_reference(ref_inputs)
                _sync(self.device)
            self._judge_intact()
            try:
                remake = self._inputs_for(seed)
                cmp = correctness.judge(cand_out, ref_out, self._exact(remake))
                correctness.check_inputs_kept(tensors_in(cand_inputs), tensors_in(ref_inputs), lambda: tensors_in(remake()))
            except CheckFailed as exc:
                raise Failure("incorrect", f"trial with seed {seed}: {exc}{_strided_hint(str(exc), ref_inputs)}")
            worst.max_abs_diff = max(worst.max_abs_diff, cmp.max_abs_diff)
            worst.max_rel_diff = max(worst.max_rel_diff, cmp.max_rel_diff)
            worst.notes += [f"trial with seed {seed}: {note}" for note in cmp.notes]
        return {"status": "ok", "trials": len(msg["seeds"]), "max_abs_diff": worst.max_abs_diff, "max_rel_diff": worst.max_rel_diff,
                "triton_launches": dict(self.triton.counts), "notes": worst.notes}

    def count_flops(self, msg: dict) -> dict:
        """The candidate's FLOPs in one more call on fresh inputs, whose output is checked like a trial's: a candidate
        that did less in the counted call than it needs would be wrong here. Asked for after the timed rounds: a
        torch.compile'd forward run once under the counter's dispatch mode ran at eager speed from then on (0.92x
        where it had measured 1.82x). A call that fails only under the counter is no verdict: the count is then missing."""
        from kernelscout.sandbox.flop_count import DtypeFlopCounter

        seed = msg["seed"]
        ref_inputs = self._make_inputs(self.problem, seed, self.problem_path)
        cand_inputs = _clone(ref_inputs)
        counter = DtypeFlopCounter(strict=True)
        launched = self.triton.counts.get("cand", 0)
        try:
            with self._side("cand"), counter:
                cand_out = self._run_candidate(cand_inputs)
                _sync(self.device)
        except Failure as exc:
            return {"status": "ok", "candidate_flops": None, "flops_uncounted": f"its call under the flop counter failed: {exc}"}
        with self._side("ref"):
            ref_out = self._run_reference(ref_inputs)
            _sync(self.device)
        self._judge_intact()
        try:
            correctness.judge(cand_out, ref_out, self._exact(self._inputs_for(seed)))
        except CheckFailed as exc:
            raise Failure("incorrect", f"the call counted for its FLOPs (seed {seed}): {exc}")
        uncovered = counter.uncovered()
        if self.triton.counts.get("cand", 0) > launched:
            uncovered = "it launched Triton kernels, whose FLOPs torch's counter does not see"
        if uncovered:
            return {"status": "ok", "candidate_flops": None, "flops_uncounted": uncovered}
        return {"status": "ok", "candidate_flops": counter.total(), "flops_uncounted": None}

    @contextlib.contextmanager
    def _side(self, side: str):
        """Which side the Triton kernels launched meanwhile belong to (Triton may have been imported
        by the last call, lazily, so the counter is asked to start watching before each)."""
        self.triton.watch()
        self.triton.side = side
        try:
            yield
        finally:
            self.triton.side = None

    # -- timing ------------------------------------------------------------------------------
    def prep(self, msg: dict) -> dict:
        """Fresh inputs for one timing round, so a result cached by input identity never matches.

        From the refill to the round's last call no candidate code may run: a candidate that keeps its
        input tensors (refilled in place) and gets code run in between computes the round's answer
        there, outside every clock (a review did it from a gc callback: softmax at 78x). So the last
        round's outputs are dropped and young garbage collected first, while only old inputs exist, and
        automatic collection, whose callbacks and finalisers would run candidate code, is off from then
        until the next round's prep (and after timing, once the candidate is unloaded)."""
        # Only the input buffers are kept; everything else the last round held goes now, before the new
        # inputs exist, with whatever finalisers hang on it: its outputs, and anything the candidate put into
        # the round (a review's candidate left an object there whose __del__ handed the heap back to the OS
        # as the old round was dropped, after the refill: softmax 7.9x, the reference page-faulting its
        # temporaries in every call). Candidate code can still run between calls by such means; what it
        # does there is judged by its effect on the reference (`stats.heap_handed_back`, the other checks).
        previous = {k: v for k, v in (self.round or {}).items() if k in ("ref", "cand", "ref_layout", "cand_layout")}
        if self.round:
            self.round.clear()
        self.round = {}
        if self.gc_held is None:
            self.gc_held = integrity.gc_isenabled()
        integrity.gc_disable()
        integrity.gc_collect(0)
        if msg.get("baseline_threads"):  # before the refill too: it replaces what the last baseline left
            self.thread_baseline = integrity.os_thread_count()
            self.thread_cpu_at_timing = {t.ident: integrity.thread_cpu_ms(t.ident) for t in self._candidate_threads()}
            self.children_cpu_at_timing = integrity.children_cpu_s()
        fresh = self._fresh_inputs(msg["seed"])
        if previous.get("ref") is not None and _layout(previous["ref"]) != previous.get("ref_layout"):
            # the candidate reached the reference's own input tensors (gc) and re-strided or moved them:
            # same values, so no check would see it, only a reference that runs slower
            raise Failure("incorrect", "the candidate changed the class, layout or storage of the reference's input tensors")
        if previous.get("cand") is not None and _layout(previous["cand"]) != previous.get("cand_layout"):
            # its own: re-strided once (to channels-last, say), the next rounds' inputs would arrive in
            # that layout, converted by this refill, outside the timed call
            raise Failure("incorrect", "the candidate changed the class, layout or storage of its input tensors, so the harness "
                                       "would convert later inputs for it outside the timed call")
        self.round = {
            "ref": _refill(previous.get("ref"), fresh),
            "cand": _refill(previous.get("cand"), fresh),
            "out": {},
            "inputs": fresh,  # as they were before either call, for a float64 run of the reference (verify)
        }
        self.round["ref_layout"], self.round["cand_layout"] = _layout(self.round["ref"]), _layout(self.round["cand"])
        _sync(self.device)
        keys = msg.get("keys") or {}
        return {"status": "ok", "inputs": {side: sample(tensors_in(fresh), key) for side, key in keys.items()}}

    def _settings_changed(self) -> Optional[str]:
        """Shared settings the candidate's call left other than they were once it was built (they are
        put back before each reference call, so the reference is timed as it was set up)."""
        if self.settings_at_load is None:
            return None
        now = integrity.shared_settings()
        changed = [f"{k} from {v} to {now[k]}" for k, v in self.settings_at_load.items() if now.get(k) != v]
        return "the candidate changed settings the reference also runs under: " + ", ".join(changed) if changed else None

    def _hooks_changed(self) -> Optional[str]:
        changed = integrity.hooks_changed(self.initial_hooks)
        changed += [f"torch's kernel for {op}" for op in integrity.kernels_replaced(self.reference_kernels)]
        return "the candidate set up code that runs inside the other side's calls: " + ", ".join(changed) if changed else None

    def _process_leak(self) -> Optional[str]:
        """A child process that ran and was reaped since timing began. It may have taken CPU (or GPU)
        time from the other side's calls, and the supervisor's checks see only what is alive when timing
        begins and ends: a helper that burns while the reference runs and is reaped before the end
        (seen: an unchanged softmax timed at 1.67x) would pass them."""
        if self.children_cpu_at_timing is None:
            return None
        # (not the PID namespace's last-pid counter: threads take ids from it too)
        used = integrity.children_cpu_s() - self.children_cpu_at_timing
        if used > 0:
            return f"child processes that ran while the candidate was being timed used {used * 1e3:.0f} ms of CPU"
        return None

    @staticmethod
    def _reference_window() -> tuple[dict[str, tuple[int, int, int]], int]:
        """What is compared across a timed reference call: every thread's schedstat, and how often the
        worker's thread has waited."""
        return integrity.thread_schedstats(), integrity.voluntary_waits()

    def _disturbed(self, before: tuple[dict[str, tuple[int, int, int]], int], after: tuple[dict[str, tuple[int, int, int]], int],
                   call_ms: float) -> Optional[str]:
        """Whether threads the candidate started (native ones included) disturbed the reference's timed
        call: "waited" if one ran while the reference had to wait, "burned" if they used more than a
        tenth of the call's time on a CPU.

        The reference runs on this thread alone, and between its operators it needs the interpreter
        lock: a helper that sleeps in C *holding* that lock (ctypes.PyDLL) stalls every step of the
        reference and almost none of a one-operator candidate, at next to no CPU, so no busy-thread
        check sees it (softmax 5.5x, timing valid, before this check). Either half alone is innocent
        (an idle pool thread waking briefly, a wait on OpenMP's barrier), and even both once may be a
        pool thread finishing its bookkeeping late: the supervisor judges how often (`disturbed_reference`).
        A thread of the candidate's that computes while the reference is timed (work queued with
        `torch.jit.fork` runs on torch's native inter-op threads) is work left running, as
        `thread_leak` is for Python threads."""
        if self.tasks_before_candidate is None:
            return None
        (stats_before, waits_before), (stats_after, waits_after) = before, after
        ran = cpu_ns = 0
        for tid, (ns, _, count) in stats_after.items():
            if tid in self.tasks_before_candidate:
                continue
            ns0, _, count0 = stats_before.get(tid, (0, 0, 0))
            ran += count != count0
            cpu_ns += ns - ns0
        if ran and waits_after > waits_before:
            return "waited"
        if cpu_ns > 0.1 * call_ms * 1e6:
            return "burned"
        return None

    def _candidate_threads(self) -> list:
        return [t for t in integrity.list_threads() if t.ident not in self.threads_before_candidate]

    def _left_threads(self) -> tuple[int, int]:
        """(busy, idle) threads the candidate left alive.

        A thread that used CPU time while the candidate was being timed may be finishing the
        candidate's work after its call returned, so it makes the timing invalid. One that sat idle
        (torch.compile on CUDA leaves one behind, docs/gpu-validation.md) did
        not change the timing and is only reported. The bar is 1 ms, or 5% of the candidate's timed
        total when that is more: doing the work elsewhere costs about the work itself.
        """
        busy = idle = 0
        bar = max(1.0, 0.05 * self.timed_candidate_ms)
        at_timing = self.thread_cpu_at_timing or {}
        for t in self._candidate_threads():
            now, start = integrity.thread_cpu_ms(t.ident), at_timing.get(t.ident)
            # born after timing began, or no way to tell: assume the worst
            if now is None or start is None or now - start > bar:
                busy += 1
            else:
                idle += 1
        return busy, idle

    INPUT_POOL = 4
    FRESH_MS = 5.0  # get_inputs() this cheap runs every round
    FRESH_NONFLOAT_MS = 50.0  # and up to this when some input is not floating point (it cannot be rescaled)
    REPLACE_EVERY = 4  # otherwise one pooled set is replaced by a fresh one every this many rounds

    def _fresh_inputs(self, seed: int) -> list[Any]:
        """New input contents for every round, from get_inputs() itself whenever that is cheap.

        get_inputs() (randn of large tensors) can cost more than the kernel being timed, so when it is
        slow a few generated sets are kept, one of them replaced by a fresh set every few rounds, and
        each round scales one by random factors in [1 - 2^-6, 1) along its first and last axes
        (`_perturb`), so no two rounds see the same float values. Integer and boolean tensors cannot
        be rescaled, so a problem with such inputs gets fresh sets every round unless get_inputs() is
        very slow: an exact repeat would let a content cache replay a result the re-check cannot
        fault (it is the right output).
        """
        state = self.__dict__.setdefault("_inputs", {}).setdefault(self.problem_sha, {"pool": [], "ms": [], "rounds": 0})
        pool, costs = state["pool"], state["ms"]
        state["rounds"] += 1
        mean_ms = sum(costs) / len(costs) if costs else 0.0
        exact = pool and any(not x.is_floating_point() for x in tensors_in(pool[0]))
        cheap = costs and (mean_ms <= self.FRESH_MS or (exact and mean_ms <= self.FRESH_NONFLOAT_MS))
        if len(pool) < self.INPUT_POOL or cheap or state["rounds"] % self.REPLACE_EVERY == 0:
            t0 = integrity.perf_counter_ns()
            fresh = self._make_inputs(self.problem, seed, self.problem_path)
            costs.append((integrity.perf_counter_ns() - t0) / 1e6)
            del costs[:-16]
            if len(pool) < self.INPUT_POOL:
                pool.append(fresh)
            else:
                pool[seed % len(pool)] = fresh
            self.inputs_rescaled = False
            return fresh
        self.inputs_rescaled = True
        gen = torch.Generator().manual_seed(seed)
        base = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        return [_each_tensor(x, lambda t: _perturb(t, gen) if t.is_floating_point() else t) for x in base]

    def call(self, msg: dict) -> dict:
        """One timed call of one side.

        The worker does the same work before and after both sides' calls and keeps only what each side's
        verdict needs: work done around one side's calls alone (the reference's settings put back before it,
        the reference's CPU-wait and page-fault reads after it, the candidate's output and thread checks after
        it) changes how warm the caches are for whichever call comes next, and a candidate that is the
        reference's own code read 0.95x in the rounds it opened and 1.05x in those where it came second, on a
        19 us call (benchmarks/aa_bias.py; 1.05-1.07x overall when only the reference's calls were preceded by
        the schedstat reads)."""
        side = msg["side"]
        inputs = self.round[side]
        model = self.reference if side == "ref" else self.candidate
        py_threads = integrity.thread_count()
        # for the reference these put back what it was set up under; for the candidate, what it had when it was
        # built (TF32 off on both sides), which its own call would have to change again, and be seen changing
        integrity.pin_precision()
        if self.settings_at_load is not None:
            integrity.restore_settings(self.settings_at_load)
        integrity.clear_trace_hooks()

        def run():
            with torch.no_grad():
                return model(*inputs)

        inputs_sample = sample(tensors_in(inputs), msg.get("key"))
        collecting = integrity.gc_isenabled()
        # as timeit does: no garbage collection inside a timed call, where it would run whatever
        # finalisers the other side's garbage carries
        integrity.gc_disable()
        integrity.pin_allocator()
        window = self._reference_window()
        faults = integrity.page_faults()
        try:
            out, timer_ms, host_ms = self.timer(run)
        except Exception as exc:
            if side == "ref":
                raise Failure("invalid_problem", f"the reference failed during timing: {_short_error(exc)}")
            raise Failure("runtime_error", self._runtime_message(exc))
        finally:
            if collecting:
                integrity.gc_enable()
        closed = self._reference_window()  # read at once: the window is the call
        faults = integrity.page_faults() - faults
        disturbed = self._disturbed(window, closed, host_ms)
        python_threads = integrity.thread_count() - py_threads
        reply: dict[str, Any] = {"status": "ok", "timer_ms": timer_ms, "host_ms": host_ms}
        if side == "ref":
            # the reference's threads kept off a CPU during its call: another process on the worker's cores
            reply["queued_ms"] = (sum(stat[1] for stat in closed[0].values()) - sum(stat[1] for stat in window[0].values())) / 1e6
            # memory the reference had to fault in again: the heap handed back to the OS between calls
            reply["faults"] = faults
            if disturbed:
                reply["disturbed"] = disturbed
            integrity.os_thread_count()  # the read the candidate's settle makes when no thread is exiting
            outputs = correctness.flatten_outputs(out, "reference")
            self._aliases_and_flags(outputs, inputs)
        else:
            if python_threads > 0:
                reply["thread_leak"] = f"{python_threads} Python thread(s) still running after the call returned"
            elif self.thread_baseline is not None:
                extra, waited_ms = integrity.settle_os_threads(self.thread_baseline)
                if extra:
                    reply["thread_leak"] = f"{extra} new OS thread(s) after the warm-up"
                # threads the call started and joined, still exiting: their teardown is the call's cost.
                # Billed to it here, so that the supervisor's wall clock, which saw the wait, agrees with
                # the timer (on one VM that took 0.2 ms a call, beyond the cross-check's tolerance).
                reply["timer_ms"] += waited_ms
                reply["host_ms"] += waited_ms
            if self.thread_cpu_at_timing is not None:
                self.timed_candidate_ms += reply["timer_ms"]
            outputs = self._validate_candidate_output(out, inputs)
        settings = self._settings_changed()  # read after both sides' calls; only the candidate's can be blamed for a change
        unfair = self._process_leak() or self._hooks_changed() or (settings if side == "cand" else None)
        if unfair:
            reply["unfair"] = unfair
        if inputs_sample is not None:
            reply["inputs_sample"], reply["outputs_sample"] = inputs_sample, sample(outputs, msg.get("key"))
        if side == "ref":
            # not kept where the candidate's call, next in half the rounds, could copy it (a review's candidate returned a
            # copy of it: linear_gelu 5.3x, correct); a re-check runs the reference again on the round's kept inputs
            self._scrub(outputs)
            outputs = None
        self.round["out"][side] = outputs
        return reply

    def _scrub(self, outputs: list[torch.Tensor]) -> None:
        """Zero the memory of the reference's outputs, unless it is the reference's own state (a forward that returns a
        weight or a buffer): freed as it was, the next allocation of its size would hand a candidate's `empty_like`
        the reference's answer."""
        if self.built is not None and self.reference is not self.built[0]:
            raise Failure("incorrect", "the candidate tampered with the harness: the worker's reference object was replaced")
        state = [t for m in self.reference.modules() for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values())
                 if isinstance(t, torch.Tensor)]
        spans = [correctness.storage_span(t) for t in state]
        for t in outputs:
            lo, hi = correctness.storage_span(t)
            if hi > lo and not any(lo < b and a < hi for a, b in spans):
                torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).zero_()

    def verify(self, msg: dict) -> dict:
        """Re-check the round just timed. The supervisor decides which rounds after both calls have
        returned, so nothing the candidate can read during its call says whether it will be checked."""
        out = dict(self.round.get("out", {}))
        if len(out) != 2:
            raise Failure("crashed", "verify needs a round with both calls made")
        deep = bool(msg.get("deep", True))
        # all that unload reads (namespaces, kernel tables, the weights' checksum: 50-100 ms together on this CPU) only at
        # the deep re-checks, the first and about one in three: what a candidate changes for the rounds it fakes and
        # puts back later is in place at each of them
        tampered = self._tampered_now(kernels=False) if deep else self._reference_tampering(weights=False)
        if tampered:
            raise Failure("incorrect", "the candidate tampered with the harness: " + "; ".join(tampered))
        with self._side("ref"):  # on a copy: a reference that updates its inputs in place leaves the kept ones as they were
            out["ref"] = self._run_reference(_clone(self.round["inputs"]))
            _sync(self.device)
        self._judge_intact(deep=deep)
        try:
            correctness.judge(out["cand"], out["ref"], self._exact(lambda: self.round["inputs"]))
        except CheckFailed as exc:
            why = (" (this round's inputs were a kept set rescaled by factors just under 1, as get_inputs() takes over "
                   f"{self.FRESH_MS:g} ms: a candidate must be right for any values of the inputs' shapes and dtypes, not "
                   "only for the values get_inputs() draws, such as an exact 0/1 mask)") if self.inputs_rescaled else ""
            raise Failure("incorrect", f"a timed call's output was wrong on re-check: {exc}{why}")
        keys = msg.get("keys") or {}
        # what was compared, for the supervisor to hold against what it kept of the round (`sample`): the candidate's
        # output as it returned it, and the reference's run again, against its output in the timed call
        samples = {side: sample(out[side], key) for side, key in keys.items()}
        if "ref" in keys:
            samples["inputs"] = sample(tensors_in(self.round["inputs"]), keys["ref"])
        return {"status": "ok", "rechecked": True, "samples": samples}

    # -- the referee's side (sandbox/referee.py) ------------------------------------------------
    def emit(self, msg: dict) -> dict:
        """The candidate's output for the inputs of a seed the supervisor has just chosen, written to a
        file in this worker's folder for the referee: a verdict reached in this process is only as
        trustworthy as the candidate that shares it."""
        tampered = self._tampered_now()
        if tampered:  # before the candidate's code runs again, and may take away what it changed
            raise Failure("incorrect", "the candidate tampered with the harness: " + "; ".join(tampered))
        inputs = self._make_inputs(self.problem, msg["seed"], self.problem_path)
        made = correctness.fingerprint(tensors_in(inputs))  # before the candidate may write into them
        with self._side("cand"):
            outputs = self._run_candidate(inputs)
            _sync(self.device)
        torch.save(correctness.portable(outputs), msg["path"])
        return {"status": "ok", "inputs": made}

    def load_reference(self, msg: dict) -> dict:
        """The reference alone, built from the same seed as in the candidate's worker, in a worker that
        never holds a candidate: the referee's."""
        if self.problem is None:
            raise Failure("crashed", "load_problem must come first")
        if self.candidate_module is not None or self.built is not None:
            raise Failure("crashed", "a referee never holds a candidate")
        integrity.restore_settings(self.initial_settings)
        self.reference = self._build(self.problem, self.problem.Model, msg["init_seed"], self.problem_path, "Model")
        self.settings_at_load = None
        self.round = {}
        return {"status": "ok"}

    def judge_emitted(self, msg: dict) -> dict:
        """The referee compares the candidate's emitted output with its own reference's on the same seed."""
        if self.reference is None:
            raise Failure("crashed", "load_reference must come first")
        inputs = self._make_inputs(self.problem, msg["seed"], self.problem_path)
        if not correctness.same_fingerprint(msg.get("inputs"), correctness.fingerprint(tensors_in(inputs))):
            # the same seed, other inputs (get_inputs() depends on the process), or the candidate's worker says so
            return {"status": "skipped", "message": "the candidate's worker reports other inputs for the same seed than this "
                    "worker makes, so it cannot judge the output (a get_inputs() that depends on the process does that)"}
        ref = self._run_reference(inputs)
        _sync(self.device)
        ref_cpu = correctness.from_portable(correctness.portable(ref), "reference")
        try:  # from here on, anything that goes wrong comes from the candidate's file
            saved = torch.load(msg["path"], map_location="cpu", weights_only=True)
            cmp = correctness.judge(correctness.from_portable(saved), ref_cpu, self._exact(self._inputs_for(msg["seed"]), on_cpu=True))
        except CheckFailed as exc:
            raise Failure("incorrect", f"judged by a second worker that never loaded the candidate: {exc}")
        except Exception as exc:
            raise Failure("incorrect", "judged by a second worker that never loaded the candidate: its output file "
                                       f"could not be read as outputs ({_short_error(exc)})")
        return {"status": "ok", "max_abs_diff": cmp.max_abs_diff, "max_rel_diff": cmp.max_rel_diff}

    def unload(self, msg: dict) -> dict:
        tampered = (integrity.changed_since(self.snapshot) if self.snapshot else []) + (
            self._reference_tampering() if self.built else [])
        # before the candidate is dropped: a kernel registered through a Library object only the candidate
        # holds is unregistered with it
        replaced = [f"torch's kernel for {op}" for op in integrity.kernels_replaced(self.kernels)]
        self.built = None
        busy_threads, idle_threads = self._left_threads()
        self.candidate = self.reference = None
        self.round = {}
        if self.candidate_module:
            sys.modules.pop(self.candidate_module, None)
        self.candidate_module = None
        if self.gc_held:  # switched off by prep for the timing rounds
            integrity.gc_enable()
        self.gc_held = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        hooks = integrity.hooks_changed(self.initial_hooks)  # left in this process, they would run in the next measurement
        hooks += replaced
        return {"status": "ok", "tampered": tampered, "extra_threads": busy_threads, "idle_threads": idle_threads, "hooks": hooks}

    def hello(self, msg: dict) -> dict:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {"status": "ok", "pid": os.getpid(), "torch": torch.__version__, "device_name": name, "threads": torch.get_num_threads(),
                "network": os.environ.get("KSCOUT_SANDBOX_NETWORK", "open (no network namespace on this platform)"),
                "pids": os.environ.get("KSCOUT_SANDBOX_PIDS", "shared (no PID namespace on this platform)"),
                "proc": os.environ.get("KSCOUT_SANDBOX_PROC", "host"),
                "files": os.environ.get("KSCOUT_SANDBOX_FILES", "open (no Landlock on this platform)"),
                "sockets": os.environ.get("KSCOUT_SANDBOX_SOCKETS", "open (no seccomp on this platform)"),
                "cpus": os.environ.get("KSCOUT_SANDBOX_CPUS", "every core of the machine; changeable (no seccomp on this platform)")}


def main() -> None:
    cmd_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(cmd_fd, False)
    os.set_inheritable(res_fd, False)
    worker = Worker()
    # torch's import leaves ~10^6 long-lived objects; freezing them keeps the gc.collect() in
    # unload from walking them after every measurement (150 ms -> a few ms).
    gc.collect()
    gc.freeze()
    handlers = {
        "hello": worker.hello,
        "load_problem": worker.load_problem,
        "load_candidate": worker.load_candidate,
        "check": worker.check,
        "count_flops": worker.count_flops,
        "prep": worker.prep,
        "call": worker.call,
        "verify": worker.verify,
        "emit": worker.emit,
        "load_reference": worker.load_reference,
        "judge": worker.judge_emitted,
        "unload": worker.unload,
    }
    while True:
        try:
            msg = protocol.recv(cmd_fd)
        except protocol.ChannelClosed:
            return
        nonce = msg.get("nonce")
        try:
            reply = handlers[msg["cmd"]](msg)
        except Failure as exc:
            reply = {"status": exc.status, "message": str(exc), **exc.extra}
        except SystemExit:
            reply = {"status": "runtime_error", "message": "the candidate called sys.exit()"}
        except KeyboardInterrupt:  # raised by code, not typed: the supervisor never sends SIGINT to a worker
            reply = {"status": "runtime_error", "message": "the candidate raised KeyboardInterrupt"}
        except BaseException as exc:  # a harness bug must not look like a candidate verdict
            reply = {"status": "crashed", "message": "worker error: " + _short_error(exc)}
            traceback.print_exc()
        reply["nonce"] = nonce
        protocol.send(res_fd, reply)
        # not kept while the next command runs: a reply's sampled values would show a candidate that walks up to this
        # frame where the reference's sample positions are (float values are nearly all distinct), and the
        # positions are what it must not know (`sample`)
        msg = reply = None


if __name__ == "__main__":
    main()
