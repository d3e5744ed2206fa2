"""Peak compute and memory bandwidth of common GPUs, from vendor datasheets and whitepapers.

The speed-of-light bound (tools/sol.py) must be a *lower* bound on time, so every figure here is the
vendor's peak at boost clock, never a measured or sustained rate. Where a datasheet lists tensor-core
rates only "with sparsity", the dense rate is that figure halved (NVIDIA's footnote says so); the
halving is written out in the table so the datasheet number stays visible. Figures a datasheet does not
give are derived from the architecture whitepaper's per-SM rates and marked as derived, or left None.

Precisions, all dense (no 2:4 sparsity):

* ``fp32``: the full-precision FP32 rate. On NVIDIA that is the CUDA-core (non-tensor) rate, which is
  what an fp32 problem gets once the harness pins TF32 off. On AMD CDNA the matrix cores compute FP32
  in full IEEE precision, so the matrix/packed FP32 rate is used: anything lower would not bound a
  kernel that uses MFMA.
* ``tf32``: tensor-core TF32 (only relevant when TF32 is allowed).
* ``fp16`` / ``bf16``: tensor-core rate with FP32 accumulation, the numerics of a PyTorch reference.
  GeForce cards run FP32 accumulation at half their FP16-accumulate rate; the table uses the FP32
  accumulate figure.
* ``fp64``: the higher of vector and FP64 tensor/matrix rate (both are full IEEE fp64).

``last_level_cache_mb`` is there because a problem whose working set fits in it can be served faster
than DRAM bandwidth allows, and then the memory side of the bound is not a bound at all.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp64"]

TERA = 1e12
GIGA = 1e9


class DeviceSpec(BaseModel):
    """One GPU's datasheet peaks. Rates in TFLOP/s (1e12), bandwidth in GB/s (1e9)."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="short unique name, also accepted by lookup")
    name: str = Field(description="the product, as the vendor names it")
    vendor: Literal["nvidia", "amd"]
    fp32_tflops: float
    tf32_tflops: Optional[float] = None
    fp16_tflops: Optional[float] = None
    bf16_tflops: Optional[float] = None
    fp64_tflops: Optional[float] = None
    bandwidth_gbs: float
    last_level_cache_mb: float
    source: str
    notes: str = ""
    aliases: tuple[tuple[str, ...], ...] = Field(
        default=(), description="token sets; a device name matches when it holds every token of one set"
    )

    def tflops(self, precision: Precision) -> Optional[float]:
        return getattr(self, f"{precision}_tflops")


def _dense(with_sparsity: float) -> float:
    """Dense tensor-core rate from a datasheet figure quoted with 2:4 sparsity."""
    return with_sparsity / 2


# fmt: off
DEVICES: tuple[DeviceSpec, ...] = (
    DeviceSpec(
        key="H100-SXM", name="NVIDIA H100 SXM5 80GB", vendor="nvidia",
        fp32_tflops=67, tf32_tflops=_dense(989), fp16_tflops=_dense(1979), bf16_tflops=_dense(1979), fp64_tflops=67,
        bandwidth_gbs=3350, last_level_cache_mb=50,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM column); L2 from the NVIDIA H100 whitepaper",
        aliases=(("h100",), ("h100", "hbm3")),
    ),
    DeviceSpec(
        key="H100-PCIe", name="NVIDIA H100 PCIe 80GB", vendor="nvidia",
        fp32_tflops=51, tf32_tflops=_dense(756), fp16_tflops=_dense(1513), bf16_tflops=_dense(1513), fp64_tflops=51,
        bandwidth_gbs=2000, last_level_cache_mb=50,
        source="NVIDIA H100 Tensor Core GPU datasheet (PCIe column); L2 from the NVIDIA H100 whitepaper",
        aliases=(("h100", "pcie"),),
    ),
    DeviceSpec(
        key="H100-NVL", name="NVIDIA H100 NVL 94GB", vendor="nvidia",
        fp32_tflops=60, tf32_tflops=_dense(835), fp16_tflops=_dense(1671), bf16_tflops=_dense(1671), fp64_tflops=60,
        bandwidth_gbs=3900, last_level_cache_mb=50,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column, per GPU)",
        aliases=(("h100", "nvl"),),
    ),
    DeviceSpec(
        key="H200", name="NVIDIA H200 SXM 141GB", vendor="nvidia",
        fp32_tflops=67, tf32_tflops=_dense(989), fp16_tflops=_dense(1979), bf16_tflops=_dense(1979), fp64_tflops=67,
        bandwidth_gbs=4800, last_level_cache_mb=60,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); L2 as torch reported it on a lent H200 "
               "(60 MiB, docs/gpu-validation.md)",
        aliases=(("h200",), ("h200", "sxm")),
    ),
    DeviceSpec(
        key="H200-NVL", name="NVIDIA H200 NVL 141GB", vendor="nvidia",
        fp32_tflops=60, tf32_tflops=_dense(835), fp16_tflops=_dense(1671), bf16_tflops=_dense(1671), fp64_tflops=60,
        bandwidth_gbs=4800, last_level_cache_mb=60,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column); L2 as on the H200 SXM",
        aliases=(("h200", "nvl"),),
    ),
    DeviceSpec(
        key="A100-40GB", name="NVIDIA A100 40GB (PCIe or SXM4)", vendor="nvidia",
        fp32_tflops=19.5, tf32_tflops=156, fp16_tflops=312, bf16_tflops=312, fp64_tflops=19.5,
        bandwidth_gbs=1555, last_level_cache_mb=40,
        source="NVIDIA A100 Tensor Core GPU datasheet (40GB PCIe and 40GB SXM columns); L2 from the NVIDIA A100 whitepaper",
        notes="the recorded spaces' A100 is this one (NVIDIA A100-PCIE-40GB), so the bare name A100 means it",
        aliases=(("a100",), ("a100", "40gb")),
    ),
    DeviceSpec(
        key="A100-80GB-PCIe", name="NVIDIA A100 80GB PCIe", vendor="nvidia",
        fp32_tflops=19.5, tf32_tflops=156, fp16_tflops=312, bf16_tflops=312, fp64_tflops=19.5,
        bandwidth_gbs=1935, last_level_cache_mb=40,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB PCIe column)",
        aliases=(("a100", "80gb", "pcie"),),
    ),
    DeviceSpec(
        key="A100-80GB-SXM", name="NVIDIA A100 80GB SXM4", vendor="nvidia",
        fp32_tflops=19.5, tf32_tflops=156, fp16_tflops=312, bf16_tflops=312, fp64_tflops=19.5,
        bandwidth_gbs=2039, last_level_cache_mb=40,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column)",
        aliases=(("a100", "80gb"),),
    ),
    DeviceSpec(
        key="L4", name="NVIDIA L4", vendor="nvidia",
        fp32_tflops=30.3, tf32_tflops=_dense(120), fp16_tflops=_dense(242), bf16_tflops=_dense(242),
        bandwidth_gbs=300, last_level_cache_mb=48,
        source="NVIDIA L4 Tensor Core GPU datasheet; L2 from the NVIDIA Ada Lovelace architecture whitepaper",
        aliases=(("l4",),),
    ),
    DeviceSpec(
        key="L40S", name="NVIDIA L40S", vendor="nvidia",
        fp32_tflops=91.6, tf32_tflops=_dense(366), fp16_tflops=_dense(733), bf16_tflops=_dense(733),
        bandwidth_gbs=864, last_level_cache_mb=96,
        source="NVIDIA L40S GPU datasheet; L2 from the NVIDIA Ada Lovelace architecture whitepaper",
        aliases=(("l40s",),),
    ),
    DeviceSpec(
        key="RTX-4090", name="NVIDIA GeForce RTX 4090", vendor="nvidia",
        fp32_tflops=82.6, tf32_tflops=82.6, fp16_tflops=165.2, bf16_tflops=165.2,
        bandwidth_gbs=1008, last_level_cache_mb=72,
        source="NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A (RTX 4090)",
        notes="fp16/bf16 are the FP32-accumulate rates; FP16 accumulate runs at 330.3",
        aliases=(("4090",),),
    ),
    DeviceSpec(
        key="RTX-3090", name="NVIDIA GeForce RTX 3090", vendor="nvidia",
        fp32_tflops=35.6, tf32_tflops=35.6, fp16_tflops=71, bf16_tflops=71,
        bandwidth_gbs=936, last_level_cache_mb=6,
        source="NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A (RTX 3090)",
        notes="fp16/bf16 are the FP32-accumulate rates; FP16 accumulate runs at 142",
        aliases=(("3090",),),
    ),
    DeviceSpec(
        key="RTX-A4000", name="NVIDIA RTX A4000", vendor="nvidia",
        fp32_tflops=19.2, tf32_tflops=19.2, fp16_tflops=_dense(153.4), bf16_tflops=_dense(153.4),
        bandwidth_gbs=448, last_level_cache_mb=4,
        source="NVIDIA RTX A4000 datasheet (FP32, 153.4 tensor TFLOPS with sparsity, bandwidth); GA104 L2 from the GA102 whitepaper",
        notes="tf32 and bf16 are derived (GA10x tensor cores: BF16 = FP16 rate, TF32 = a quarter of FP16-accumulate), not on the datasheet",
        aliases=(("a4000",),),
    ),
    DeviceSpec(
        key="RTX-2080-Ti", name="NVIDIA GeForce RTX 2080 Ti", vendor="nvidia",
        fp32_tflops=14.2, fp16_tflops=56.9,
        bandwidth_gbs=616, last_level_cache_mb=5.5,
        source="NVIDIA Turing GPU architecture whitepaper, appendix A (RTX 2080 Ti Founders Edition)",
        notes="Founders Edition clocks (reference: 13.4 / 53.8), the higher so the bound stays a lower bound; "
              "Turing has no TF32 or BF16 tensor cores",
        aliases=(("2080", "ti"),),
    ),
    DeviceSpec(
        key="MI300X", name="AMD Instinct MI300X", vendor="amd",
        fp32_tflops=163.4, tf32_tflops=653.7, fp16_tflops=1307.4, bf16_tflops=1307.4, fp64_tflops=163.4,
        bandwidth_gbs=5300, last_level_cache_mb=256,
        source="AMD Instinct MI300X accelerator datasheet (dense figures; FP32 = vector and matrix); 256 MB AMD Infinity Cache",
        notes="one device as HIP sees it in the default SPX partition mode",
        aliases=(("mi300x",),),
    ),
    DeviceSpec(
        key="MI250X-GCD", name="AMD Instinct MI250X, one GCD", vendor="amd",
        fp32_tflops=95.7 / 2, fp16_tflops=383 / 2, bf16_tflops=383 / 2, fp64_tflops=95.7 / 2,
        bandwidth_gbs=3276.8 / 2, last_level_cache_mb=8,
        source="AMD Instinct MI250X accelerator datasheet, halved: the package holds two GCDs, each with half the CUs and HBM",
        notes="HIP shows each GCD as its own device, so a kernel runs on one; the recorded spaces' MI250X data "
              "(benchmark_hub) is one GCD. FP32 is the matrix/packed rate (full IEEE fp32); vector FP32 is half that. No TF32",
        aliases=(("mi250x",), ("mi250x", "gcd")),
    ),
    DeviceSpec(
        key="MI250X-package", name="AMD Instinct MI250X, whole package (2 GCDs)", vendor="amd",
        fp32_tflops=95.7, fp16_tflops=383, bf16_tflops=383, fp64_tflops=95.7,
        bandwidth_gbs=3276.8, last_level_cache_mb=16,
        source="AMD Instinct MI250X accelerator datasheet",
        notes="only reachable by a kernel split across both GCDs; a single HIP device is MI250X-GCD",
        aliases=(("mi250x", "package"), ("mi250x", "whole")),
    ),
)
# fmt: on

# Words that name the vendor or product line and tell nothing about which device it is.
_NOISE = {"nvidia", "geforce", "amd", "instinct", "radeon", "tesla", "quadro", "rtx", "gpu", "accelerator"}
# Words a device name may carry beyond its alias without changing the peaks the table holds
# (memory size, memory kind, form factor); any other leftover word means an unknown variant.
_HARMLESS = re.compile(r"^(\d+gb|hbm\d*e?|gddr\d+x?|pcie|sxm\d?|oam|vf|mi250)$")


class UnknownDeviceError(ValueError):
    """No row of the table fits the name; the message lists the ones that exist."""


def _tokens(name: str) -> list[str]:
    # Split letters from a trailing digit run only at separators, so "a100" and "80gb" stay whole.
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t and t not in _NOISE]


def _score(spec: DeviceSpec, tokens: list[str]) -> int:
    """How many tokens of the best alias the name holds, or 0 when the name is some other device."""
    if tokens == _tokens(spec.key):
        return 100
    best = 0
    for alias in spec.aliases:
        if set(alias) <= set(tokens):
            leftover = [t for t in tokens if t not in alias]
            if all(_HARMLESS.match(t) for t in leftover):
                best = max(best, len(alias))
    return best


def find_device(name: str) -> Optional[DeviceSpec]:
    """The table row for a device name, or None.

    Accepts what ``torch.cuda.get_device_name`` returns ("NVIDIA H100 80GB HBM3", "NVIDIA A100-PCIE-40GB",
    "AMD Instinct MI250X"), the short names of the recorded spaces ("A100", "RTX_3090", "MI250X") and the
    table's keys. A name with a word the table does not know ("RTX 3090 Ti", "L40") matches nothing rather
    than the nearest row, because a wrong row gives a wrong bound silently.
    """
    tokens = _tokens(name)
    if not tokens:
        return None
    scored = sorted(((_score(s, tokens), s) for s in DEVICES), key=lambda p: -p[0])
    if scored[0][0] == 0:
        return None
    if len(scored) > 1 and scored[1][0] == scored[0][0]:
        return None
    return scored[0][1]


def lookup_device(name: str) -> DeviceSpec:
    """Like `find_device`, but an unknown name raises an error that says what is known."""
    spec = find_device(name)
    if spec is None:
        known = ", ".join(s.key for s in DEVICES)
        raise UnknownDeviceError(
            f"no peak figures for device {name!r}; known devices: {known}. "
            "Pass one of those names (for a close variant, a faster row keeps the bound a lower bound; a slower one can flag honest times)."
        )
    return spec
