"""Generic PyTorch-level rewrites that turn any problem or candidate into a new candidate, with no LLM.

Each rewrite wraps a parent (a KernelBench problem's ``Model`` or a candidate's ``ModelNew``) in a
new ``ModelNew``: torch.compile, CUDA-graph replay, channels_last, TorchScript freezing, inference
mode. The agent never imports or runs the parent (it is untrusted and only the sandbox runs code);
it reads the parent's text for a few static features and renders source that, inside the sandbox,
loads the parent from its absolute path and wraps it.

Two rules keep every rendered candidate honest:

* ``ModelNew.__init__`` builds the wrapped model first, with the same arguments, so under the
  harness's seed its weights are exactly the reference's.
* Semantics and precision never change: no ``.eval()`` unless no submodule depends on the training
  flag (checked again at run time), no TF32, no reduced-precision autocast, no fast-math.

Anything slow (compiling, tracing, capturing a graph) happens in ``__init__`` on the problem's own
``get_inputs()``, so it falls under the harness's build timeout, not the per-run one, and the forward
is called under ``no_grad`` exactly as the harness calls it, so no guard or trace goes stale.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from kernelscout.agent.policies import tunables

LINEAGE_MARK = "# kernelscout-lineage:"
REWRITE_MARK = "# kernelscout-rewrite:"
MAX_CHAIN = 16


# -- static features --------------------------------------------------------------------------

_CONV2D = {"Conv2d", "conv2d", "ConvTranspose2d", "conv_transpose2d", "LazyConv2d"}
_CONV3D = {"Conv3d", "conv3d", "ConvTranspose3d", "conv_transpose3d", "LazyConv3d"}
_CONV1D = {"Conv1d", "conv1d", "ConvTranspose1d", "conv_transpose1d"}
_MATMUL = {"Linear", "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "Bilinear", "addmv", "mv"}
_DROPOUT = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
            "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
_BATCHNORM = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d", "LazyBatchNorm2d",
              "LazyBatchNorm3d", "batch_norm"}
_TRAINING_MODULES = {"InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "RNN", "LSTM", "GRU",
                     "MultiheadAttention", "Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer",
                     "TransformerEncoder", "TransformerDecoder"}
_NORM = {"LayerNorm", "layer_norm", "GroupNorm", "group_norm", "RMSNorm", "rms_norm", "InstanceNorm1d",
         "InstanceNorm2d", "InstanceNorm3d", "instance_norm", "normalize", "local_response_norm"}
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
           "normal", "normal_", "uniform_", "exponential_", "randperm"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "softmax", "log_softmax", "logsumexp", "var", "std",
               "norm", "cumsum", "cumprod", "prod", "argmax", "argmin", "var_mean", "std_mean", "Softmax",
               "LogSoftmax", "all", "any", "median", "topk", "sort"}
_PARAM_LAYERS = _CONV2D | _CONV3D | _CONV1D | _BATCHNORM | {"Linear", "Bilinear", "LayerNorm", "GroupNorm", "RMSNorm",
                                                            "Embedding", "EmbeddingBag", "Parameter", "PReLU",
                                                            "register_buffer"} | _TRAINING_MODULES
_HOST_SYNC = {"item", "tolist", "nonzero", "cpu", "numpy", "unique", "masked_select"}


class StaticFeatures(BaseModel):
    """What a light AST scan of the problem and the parent chain says; never runs the code.

    Used twice: to decide which rewrites apply, and as inputs a learned surrogate can use.
    """

    uses_conv: bool = False
    conv_dims: int = Field(0, description="largest convolution dimensionality seen (0: none)")
    uses_matmul: bool = False
    uses_dropout: bool = False
    uses_batchnorm: bool = False
    uses_training_flag: bool = Field(False, description="reads self.training or holds modules that behave differently in eval()")
    uses_norm: bool = False
    uses_random: bool = False
    uses_host_sync: bool = Field(False, description=".item(), .nonzero(), .cpu() and the like: breaks graph capture")
    has_parameters: bool = False
    has_control_flow: bool = Field(False, description="if/for/while inside forward: tracing may bake one branch in")
    uses_triton: bool = False
    uses_cpp_extension: bool = False
    uses_cupy: bool = False
    n_ops: int = Field(0, description="calls and arithmetic operators inside forward methods")
    n_reductions: int = 0
    n_lines: int = 0
    lineage: list[str] = Field(default_factory=list, description="rewrites already applied, oldest first")

    @property
    def training_dependent(self) -> bool:
        return self.uses_dropout or self.uses_batchnorm or self.uses_training_flag

    @property
    def custom_kernel(self) -> bool:
        return self.uses_triton or self.uses_cpp_extension or self.uses_cupy


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def scan_source(source: str) -> StaticFeatures:
    """Static features of one module's text (a problem or a candidate)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return StaticFeatures(n_lines=source.count("\n") + 1)
    f = StaticFeatures(n_lines=source.count("\n") + 1, lineage=read_lineage(source))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            names.append(_call_name(node))
        elif isinstance(node, ast.Attribute) and node.attr == "training":
            f.uses_training_flag = True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            f.uses_triton |= any(m.split(".")[0] == "triton" for m in modules)
            f.uses_cupy |= any(m.split(".")[0] == "cupy" for m in modules)
            f.uses_cpp_extension |= any(m.startswith("torch.utils.cpp_extension") for m in modules)
    f.uses_cpp_extension |= any(n in ("load_inline", "load") for n in names) and "cpp_extension" in source
    f.conv_dims = 3 if _CONV3D & set(names) else 2 if _CONV2D & set(names) else 1 if _CONV1D & set(names) else 0
    f.uses_conv = f.conv_dims > 0
    f.uses_matmul = bool(_MATMUL & set(names)) or any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in ast.walk(tree))
    f.uses_dropout = bool(_DROPOUT & set(names))
    f.uses_batchnorm = bool(_BATCHNORM & set(names))
    f.uses_training_flag |= bool(_TRAINING_MODULES & set(names))
    f.uses_norm = bool(_NORM & set(names))
    f.has_parameters = bool(_PARAM_LAYERS & set(names))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
            for node in ast.walk(fn):
                if isinstance(node, (ast.Call, ast.BinOp)):
                    f.n_ops += 1
                if isinstance(node, ast.Call):
                    name = _call_name(node)
                    f.n_reductions += name in _REDUCTIONS
                    f.uses_random |= name in _RANDOM
                    f.uses_host_sync |= name in _HOST_SYNC
                elif isinstance(node, (ast.If, ast.For, ast.While, ast.IfExp)):
                    f.has_control_flow = True
    f.uses_random |= f.uses_dropout
    return f


def read_lineage(source: str) -> list[str]:
    """The rewrites a rendered candidate says were applied to get it (empty for anything else)."""
    for line in source.splitlines()[:40]:
        if line.startswith(LINEAGE_MARK):
            try:
                value = json.loads(line[len(LINEAGE_MARK):])
            except ValueError:
                return []
            return [str(v) for v in value] if isinstance(value, list) else []
    return []


def _parent_path_of(source: str) -> Optional[str]:
    """PARENT_PATH of a rendered candidate, so features can follow the chain back to real code."""
    if REWRITE_MARK not in source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "PARENT_PATH" and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def chain_features(parent_path: str | Path, problem_path: str | Path | None = None) -> StaticFeatures:
    """Features of a parent, following rendered wrappers back to the real code, merged with the problem's.

    A rendered wrapper contributes only its lineage: its own text is boilerplate, and what matters
    (convolutions, dropout, Triton) is in the code it wraps.
    """
    parent_source = Path(parent_path).read_text()
    chain = [parent_source]
    path: Optional[str] = _parent_path_of(parent_source)
    while path and len(chain) < MAX_CHAIN and Path(path).exists():
        chain.append(Path(path).read_text())
        path = _parent_path_of(chain[-1])
    if problem_path and Path(problem_path).resolve() != Path(parent_path).resolve():
        chain.append(Path(problem_path).read_text())
    merged = StaticFeatures(lineage=read_lineage(parent_source))
    for text in chain:
        if REWRITE_MARK in text and _parent_path_of(text):
            continue
        other = scan_source(text)
        for name, value in other.model_dump(exclude={"lineage"}).items():
            current = getattr(merged, name)
            setattr(merged, name, (current or value) if isinstance(value, bool) else max(current, value))
    return merged


def defines_class(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body)


# -- rendering --------------------------------------------------------------------------------
#
# A rendered candidate writes its parameters as module-level knobs under the tunable convention
# (TUNABLE plus one assignment per knob), so the tuner keeps tuning a rewrite after it is measured,
# and rendering a parameter set gives byte for byte what with_config() gives from another one: the
# same program always has the same sha, however the search reached it.

_PRELUDE = '''"""{name}: {hypothesis}

Generated by the kernelscout tuner. It wraps the {cls} of its parent (the file named below, whose text it
carries, so that it is one self-contained file); __init__ builds that model first, with the same arguments,
so under the harness's seed its weights equal the reference's. The knobs below follow the tunable convention
(docs/tuner.md).
"""
{rewrite_mark} {name}
{lineage_mark} {lineage}
import inspect
import linecache
import sys
import types

import torch
import torch.nn as nn

PARENT_PATH = {parent_path!r}
PARENT_CLASS = {cls!r}
PROBLEM_PATH = {problem_path!r}
DEVICE = {device!r}
{knobs}
_PARENT_SOURCE = {parent_source!r}
_PROBLEM_SOURCE = {problem_source!r}


def _load(source, name, path):
    """The module of a source text: the sandbox's worker may not read the user's files. Its file name is not the path
    (torch.compile opened that file, and was refused); with the text in linecache under that name, inspect (the
    training-flag check below, Triton's JIT) and tracebacks still read it."""
    filename = f"<kscout copy of {{path}}>"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


_parent = _load(_PARENT_SOURCE, __name__ + "__parent", PARENT_PATH)
_problem = _parent if _PROBLEM_SOURCE is None else _load(_PROBLEM_SOURCE, __name__ + "__problem", PROBLEM_PATH)


def _build_parent(*args, **kwargs):
    return getattr(_parent, PARENT_CLASS)(*args, **kwargs).to(DEVICE)


def _example_inputs():
    """The problem's own inputs on DEVICE, drawn without moving the global RNG."""
    devices = [torch.device(DEVICE).index or 0] if DEVICE.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        inputs = list(_problem.get_inputs())
    return [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]


def _map_tensors(fn, out):
    if isinstance(out, torch.Tensor):
        return fn(out)
    if type(out) in (list, tuple):
        return type(out)(_map_tensors(fn, o) for o in out)
    if type(out) is dict:
        return {{k: _map_tensors(fn, v) for k, v in out.items()}}
    return out
'''

_TRAINING_CHECK = '''

_TRAINING_DEPENDENT = tuple(t for t in (
    getattr(nn.modules.dropout, "_DropoutNd", None), getattr(nn.modules.batchnorm, "_BatchNorm", None),
    getattr(nn.modules.instancenorm, "_InstanceNorm", None), nn.RNNBase, nn.MultiheadAttention,
    nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer) if t is not None)


def _training_dependent(model):
    """Submodules whose output depends on .training: calling eval() on them would change the result."""
    found = []
    for name, module in model.named_modules():
        cls = type(module)
        if isinstance(module, _TRAINING_DEPENDENT):
            found.append(f"{name or 'model'} ({cls.__name__})")
            continue
        if cls.__module__.startswith("torch."):
            continue
        try:
            text = inspect.getsource(cls)
        except (OSError, TypeError):
            text = ""
        if ".training" in text or "dropout" in text.lower():
            found.append(f"{name or 'model'} ({cls.__name__} reads the training flag or uses dropout)")
    return found
'''

_TENSOR_ARGS = '''


class _TensorArgs(nn.Module):
    """Calls the model with its non-tensor arguments fixed to the example's: trace and graphs take tensors only."""

    def __init__(self, model, example):
        super().__init__()
        self.model = model
        self.is_tensor = [isinstance(x, torch.Tensor) for x in example]  # not None as a mark: None may be an argument
        self.fixed = [None if t else x for t, x in zip(self.is_tensor, example)]

    def split(self, args):
        """The tensor arguments, or None when a non-tensor argument differs from the example's."""
        if len(args) != len(self.fixed):
            return None
        for a, t, f in zip(args, self.is_tensor, self.fixed):
            if t != isinstance(a, torch.Tensor) or (not t and a != f):
                return None
        return [a for a in args if isinstance(a, torch.Tensor)]

    def forward(self, *tensors):
        it = iter(tensors)
        return self.model(*[next(it) if t else f for t, f in zip(self.is_tensor, self.fixed)])
'''


class RewriteError(ValueError):
    """A rewrite asked for something it cannot render (bad params, a parent it does not apply to)."""


class Rewrite:
    """One named transform. Its parameters are knobs (upper-case module constants in the rendered source).

    Subclasses set name, Params (a pydantic model whose fields are the knobs, with defaults), the
    knobs worth tuning for a parent (space), starting points (variants) and the body template.
    """

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]]
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    # Prior order of promise: variant i of this rewrite ranks at i + rank_offset. Set from what was
    # measured on the examples (docs/tuner.md); the surrogate, not this number, decides what is measured.
    rank_offset: ClassVar[float] = 0.0
    blocked_after: ClassVar[frozenset[str]] = frozenset()  # rewrites in the lineage that rule this one out

    def hypothesis(self, params: BaseModel) -> str:
        raise NotImplementedError

    def space(self, device: str, features: StaticFeatures) -> dict[str, list[Any]]:
        """Knobs the tuner may turn later, each with its values in a meaningful order."""
        return {}

    def starting_points(self, device: str, features: StaticFeatures) -> list[dict[str, Any]]:
        return [{}]

    def applies(self, device: str, features: StaticFeatures) -> bool:
        return _base(device) in self.devices and not (self.blocked_after & set(features.lineage))

    def variants(self, device: str, features: StaticFeatures) -> list[dict[str, Any]]:
        """Full parameter sets worth trying first on this parent, most promising first; [] if it does not apply."""
        if not self.applies(device, features):
            return []
        return [self.Params(**v).model_dump() for v in self.starting_points(device, features)]

    def applicable(self, device: str, features: StaticFeatures) -> bool:
        return bool(self.variants(device, features))

    def body(self) -> str:
        raise NotImplementedError

    def render(self, parent_path: str | Path, params: dict[str, Any], *, problem_path: str | Path | None = None,
               device: str = "cpu", parent_class: Optional[str] = None) -> str:
        """Source of a candidate module that wraps the parent at parent_path, carrying the parent's text and the
        problem's (their paths are kept for messages and for following the chain, `chain_features`).

        problem_path defaults to parent_path (the parent is the problem itself); the wrapped class is
        parent_class, or else ModelNew when the parent defines one and Model otherwise.
        """
        p = self.Params.model_validate(params)
        parent = Path(parent_path).resolve()
        problem = Path(problem_path).resolve() if problem_path else parent
        parent_source = parent.read_text()
        cls = parent_class or ("ModelNew" if defines_class(parent_source, "ModelNew") else "Model")
        if cls not in ("Model", "ModelNew") or not defines_class(parent_source, cls):
            raise RewriteError(f"{parent} defines no class {cls}")
        space = self.space(device, chain_features(parent, problem))
        values = p.model_dump()
        for knob, options in space.items():
            if values[knob] not in options:
                raise RewriteError(f"{self.name}: {knob}={values[knob]!r} is not among {options} for this parent")
        knobs = "\n"
        if space:
            knobs += f"\n{tunables.SPACE_NAME} = {space!r}\n"
        knobs += "".join(f"{k} = {v!r}\n" for k, v in values.items())
        head = _PRELUDE.format(
            name=self.name, hypothesis=self.hypothesis(self.Params()), cls=cls,
            rewrite_mark=REWRITE_MARK, lineage_mark=LINEAGE_MARK,
            lineage=json.dumps(read_lineage(parent_source) + [self.name]),
            parent_path=str(parent), problem_path=str(problem), device=device, knobs=knobs,
            parent_source=parent_source, problem_source=None if problem == parent else problem.read_text(),
        )
        return head + self.body()


def _base(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def rewrite_of(source: str) -> Optional[str]:
    """Name of the rewrite that rendered this source (None for hand- or LLM-written code)."""
    match = re.search(rf"^{re.escape(REWRITE_MARK)} (\w+)", source, re.M)
    return match.group(1) if match else None


# -- torch.compile ----------------------------------------------------------------------------

# torch.compile refuses mode= and options= together, so modes are spelled as their option sets
# (torch._inductor.list_mode_options in torch 2.13); the rendered source carries this table.
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": True},
}


class CompileParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    MODE: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"] = "default"
    FREEZING: bool = Field(False, description="inductor freezing: weights become constants, pre-packed for oneDNN/MKL")
    FULLGRAPH: bool = Field(False, description="refuse graph breaks")
    CPP_WRAPPER: bool = Field(False, description="host-side wrapper in C++ instead of Python")
    AGGRESSIVE_FUSION: bool = Field(False, description="fuse even nodes that share no memory access")
    SIMDLEN: int = Field(0, description="inductor cpp.simdlen in bits; 0 detects the widest the CPU has")
    MIN_CHUNK_SIZE: int = Field(512, description="inductor cpp.min_chunk_size: least work per parallel chunk")
    SPLIT_REDUCTIONS: bool = Field(True, description="split large reductions into two parallel stages")


class TorchCompile(Rewrite):
    name = "torch_compile"
    Params = CompileParams
    blocked_after = frozenset({"torch_compile", "jit_freeze", "cuda_graphs"})

    def hypothesis(self, p: CompileParams) -> str:
        why = [("Inductor fuses chains of elementwise and reduction ops into single generated loops, "
                "so intermediates never round-trip through memory")]
        if p.FREEZING:
            why.append("freezing turns the weights into constants so convolution/GEMM weights are pre-packed once")
        if p.MODE.startswith("max-autotune"):
            why.append("max-autotune benchmarks alternative GEMM/conv templates for these exact shapes")
        if MODE_OPTIONS[p.MODE].get("triton.cudagraphs"):
            why.append("CUDA graphs replay the whole forward with one launch")
        if p.FULLGRAPH:
            why.append("fullgraph refuses graph breaks, so no eager fallback sits between compiled pieces")
        if p.CPP_WRAPPER:
            why.append("a C++ host wrapper cuts the Python overhead between kernels, which shows on small shapes")
        if p.AGGRESSIVE_FUSION:
            why.append("aggressive fusion merges loops that share no buffer, saving passes and launches")
        if p.SIMDLEN:
            why.append(f"a {p.SIMDLEN}-bit vector width can avoid AVX-512 frequency drops")
        if p.MIN_CHUNK_SIZE > 512:
            why.append("bigger parallel chunks cut OpenMP scheduling overhead when each loop is short")
        if not p.SPLIT_REDUCTIONS:
            why.append("unsplit reductions save a second pass and a temporary when there is already enough parallelism")
        return "; ".join(why) + "."

    def applies(self, device: str, features: StaticFeatures) -> bool:
        # Triton runs interpreted on a CPU: there is nothing to time.
        return super().applies(device, features) and not (features.uses_triton and _base(device) == "cpu")

    def space(self, device: str, features: StaticFeatures) -> dict[str, list[Any]]:
        heavy = features.uses_conv or features.uses_matmul
        if _base(device) == "cuda":
            modes = ["default", "reduce-overhead"] + (["max-autotune-no-cudagraphs", "max-autotune"] if heavy else [])
        else:
            modes = ["default"] + (["max-autotune-no-cudagraphs"] if heavy else [])
        out: dict[str, list[Any]] = {"MODE": modes}
        if features.has_parameters:
            out["FREEZING"] = [False, True]
        out.update(FULLGRAPH=[False, True], CPP_WRAPPER=[False, True], AGGRESSIVE_FUSION=[False, True])
        if _base(device) == "cpu":
            out.update(SIMDLEN=[0, 256], MIN_CHUNK_SIZE=[512, 4096])
        if features.n_reductions:
            out["SPLIT_REDUCTIONS"] = [True, False]
        return out

    def starting_points(self, device: str, features: StaticFeatures) -> list[dict[str, Any]]:
        # The rest of the space is reached as tunable neighbours of whichever of these measures well.
        out: list[dict[str, Any]] = [{}]
        if _base(device) == "cuda":
            out.append({"MODE": "reduce-overhead"})
        if features.has_parameters:
            out.append({"FREEZING": True})
            if (features.uses_conv or features.uses_matmul) and _base(device) == "cpu":
                out.append({"MODE": "max-autotune-no-cudagraphs", "FREEZING": True})
        out.append({"CPP_WRAPPER": True})
        return out

    def body(self) -> str:
        return '''

OPTIONS = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": True},
}[MODE] | {
    "compile_threads": 1,  # no compile-worker pool: its thread would outlive the build
    "freezing": FREEZING,
    "cpp_wrapper": CPP_WRAPPER,
    "aggressive_fusion": AGGRESSIVE_FUSION,
    "cpp.min_chunk_size": MIN_CHUNK_SIZE,
    "split_reductions": SPLIT_REDUCTIONS,
}
if SIMDLEN:
    OPTIONS["cpp.simdlen"] = SIMDLEN
# CUDA-graph outputs live in a pool the next replay overwrites: hand out fresh tensors instead.
CLONE_OUTPUTS = OPTIONS.get("triton.cudagraphs", False)


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _build_parent(*args, **kwargs)  # first: same seed, same weights as the reference
        self.compiled = torch.compile(self.inner, fullgraph=FULLGRAPH, dynamic=False, options=OPTIONS)
        example = _example_inputs()
        with torch.no_grad():  # compile now, under the same grad mode the harness calls forward with
            for _ in range(3 if CLONE_OUTPUTS else 1):
                self.compiled(*example)

    def forward(self, *args):
        out = self.compiled(*args)
        return _map_tensors(torch.clone, out) if CLONE_OUTPUTS else out
'''


# -- TorchScript freeze -----------------------------------------------------------------------

class JitParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    OPTIMIZE_FOR_INFERENCE: bool = True


class JitFreeze(Rewrite):
    name = "jit_freeze"
    Params = JitParams
    rank_offset = 2.0
    blocked_after = frozenset({"torch_compile", "jit_freeze", "cuda_graphs", "inference_mode"})

    def hypothesis(self, p: JitParams) -> str:
        text = "TorchScript trace + freeze removes Python dispatch per op and inlines the weights as constants"
        if p.OPTIMIZE_FOR_INFERENCE:
            text += ("; optimize_for_inference folds conv+batchnorm, fuses conv+relu/add through oneDNN and pre-packs "
                     "weights (CPU) or picks fused cuDNN paths")
        return text + "."

    def applies(self, device: str, features: StaticFeatures) -> bool:
        # freeze needs eval(): the same model only if nothing depends on the training flag.
        return (super().applies(device, features) and not features.training_dependent
                and not features.uses_random and not features.custom_kernel)

    def space(self, device: str, features: StaticFeatures) -> dict[str, list[Any]]:
        return {"OPTIMIZE_FOR_INFERENCE": [True, False]}

    def starting_points(self, device: str, features: StaticFeatures) -> list[dict[str, Any]]:
        return [{"OPTIMIZE_FOR_INFERENCE": True}, {"OPTIMIZE_FOR_INFERENCE": False}]

    def body(self) -> str:
        return _TRAINING_CHECK + _TENSOR_ARGS + '''


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        inner = _build_parent(*args, **kwargs)  # first: same seed, same weights as the reference
        changed = _training_dependent(inner)
        if changed:
            raise RuntimeError("jit_freeze needs eval(), which would change what these submodules compute: "
                               + ", ".join(changed))
        example = _example_inputs()
        self.bound = _TensorArgs(inner, example)
        tensors = self.bound.split(example)
        with torch.no_grad():
            traced = torch.jit.trace(self.bound, tuple(tensors), check_trace=False)
            frozen = torch.jit.freeze(traced.eval())  # eval() is safe: nothing above reads the training flag
            if OPTIMIZE_FOR_INFERENCE:
                frozen = torch.jit.optimize_for_inference(frozen)
            for _ in range(3):  # the profiling executor specialises during the first calls
                frozen(*tensors)
        self.frozen = frozen

    def forward(self, *args):
        tensors = self.bound.split(args)
        if tensors is None:  # a non-tensor argument differs from the traced one: run the model itself
            return self.bound.model(*args)
        return self.frozen(*tensors)
'''


# -- channels_last ----------------------------------------------------------------------------

class ChannelsLastParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    NDIM: Literal[4, 5] = 4
    CONTIGUOUS_OUTPUT: bool = Field(False, description="convert outputs back to the default (NCHW) layout")


class ChannelsLast(Rewrite):
    name = "channels_last"
    Params = ChannelsLastParams
    rank_offset = 0.5
    blocked_after = frozenset({"channels_last", "torch_compile", "jit_freeze", "cuda_graphs"})

    def hypothesis(self, p: ChannelsLastParams) -> str:
        layout = "NHWC" if p.NDIM == 4 else "NDHWC"
        text = (f"{layout} lets oneDNN/cuDNN convolve directly instead of reordering activations to and from a "
                "blocked layout on every call")
        if not p.CONTIGUOUS_OUTPUT:
            text += "; the output keeps that layout, saving one copy"
        return text + "."

    def applies(self, device: str, features: StaticFeatures) -> bool:
        return super().applies(device, features) and features.conv_dims >= 2 and not features.custom_kernel

    def space(self, device: str, features: StaticFeatures) -> dict[str, list[Any]]:
        return {"CONTIGUOUS_OUTPUT": [False, True]}

    def starting_points(self, device: str, features: StaticFeatures) -> list[dict[str, Any]]:
        # Keeping the output NHWC first: on the examples the copy back to NCHW cost more than the layout
        # saved (docs/tuner.md). The harness compares values, shape and dtype, not strides.
        ndim = 5 if features.conv_dims == 3 else 4
        return [{"NDIM": ndim, "CONTIGUOUS_OUTPUT": False}, {"NDIM": ndim, "CONTIGUOUS_OUTPUT": True}]

    def body(self) -> str:
        return '''

FORMAT = torch.channels_last if NDIM == 4 else torch.channels_last_3d


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _build_parent(*args, **kwargs)  # first: same seed, same weights as the reference
        self.inner.to(memory_format=FORMAT)  # only NDIM-dimensional weights change layout; values are untouched

    def forward(self, *args):
        args = [a.contiguous(memory_format=FORMAT) if isinstance(a, torch.Tensor) and a.dim() == NDIM else a
                for a in args]
        out = self.inner(*args)
        return _map_tensors(lambda t: t.contiguous(), out) if CONTIGUOUS_OUTPUT else out
'''


# -- CUDA graphs ------------------------------------------------------------------------------

class CudaGraphParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    WARMUP: int = Field(3, ge=1, le=20, description="eager calls on a side stream before capture")


class CudaGraphs(Rewrite):
    name = "cuda_graphs"
    Params = CudaGraphParams
    devices = ("cuda",)
    rank_offset = 0.5
    blocked_after = frozenset({"cuda_graphs", "torch_compile", "jit_freeze"})

    def hypothesis(self, p: CudaGraphParams) -> str:
        return ("Replaying one captured CUDA graph replaces every kernel launch of the forward with a single "
                "launch, which wins when the forward is many small kernels and the CPU is the bottleneck.")

    def applies(self, device: str, features: StaticFeatures) -> bool:
        return super().applies(device, features) and not features.uses_host_sync

    def body(self) -> str:
        return _TENSOR_ARGS + '''


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        inner = _build_parent(*args, **kwargs)  # first: same seed, same weights as the reference
        example = _example_inputs()
        self.bound = _TensorArgs(inner, example)
        self.static_inputs = [t.clone() for t in self.bound.split(example)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.bound(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_output = self.bound(*self.static_inputs)
        torch.cuda.synchronize()

    def forward(self, *args):
        tensors = self.bound.split(args)
        if tensors is None or any(t.shape != s.shape or t.dtype != s.dtype or t.device != s.device
                                  for t, s in zip(tensors, self.static_inputs)):
            return self.bound.model(*args)  # not what was captured: run eagerly
        for static, fresh in zip(self.static_inputs, tensors):
            static.copy_(fresh)
        self.graph.replay()
        # The graph writes into the same output memory on every replay: return fresh copies.
        return _map_tensors(torch.clone, self.static_output)
'''


# -- inference mode ---------------------------------------------------------------------------

class InferenceModeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InferenceMode(Rewrite):
    name = "inference_mode"
    Params = InferenceModeParams
    rank_offset = 3.0
    blocked_after = frozenset({"inference_mode", "torch_compile", "jit_freeze", "cuda_graphs"})

    def hypothesis(self, p: InferenceModeParams) -> str:
        return ("inference_mode skips autograd's version counters and view tracking on every op (no_grad still "
                "keeps them), which shows when the forward is many small ops. It does not call eval().")

    def body(self) -> str:
        return '''

class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.inner = _build_parent(*args, **kwargs)  # first: same seed, same weights as the reference

    def forward(self, *args):
        with torch.inference_mode():
            return self.inner(*args)
'''


REWRITES: dict[str, Rewrite] = {r.name: r for r in (TorchCompile(), JitFreeze(), ChannelsLast(), CudaGraphs(), InferenceMode())}


def get_rewrite(name: str) -> Rewrite:
    try:
        return REWRITES[name]
    except KeyError:
        raise RewriteError(f"unknown rewrite {name!r}; known: {', '.join(REWRITES)}") from None


def applicable_rewrites(device: str, features: StaticFeatures) -> list[tuple[Rewrite, list[dict[str, Any]]]]:
    """Every rewrite that applies here with its starting parameter sets, in the registry's order."""
    out = []
    for rewrite in REWRITES.values():
        variants = rewrite.variants(device, features)
        if variants:
            out.append((rewrite, variants))
    return out


def render(name: str, parent_path: str | Path, params: dict[str, Any], **kw: Any) -> str:
    """Render rewrite `name` over the parent; see Rewrite.render."""
    return get_rewrite(name).render(parent_path, params, **kw)
