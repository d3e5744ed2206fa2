"""Fused C++/OpenMP kernel: modulation, GELU and sigmoid gate in one pass.

The reference makes five whole-tensor passes and four temporaries; this reads x
and gate once and writes the output once. Rows are split across OpenMP threads
(the thread count follows torch.get_num_threads()), and the inner loop over the
hidden dimension is branch-free so GCC vectorises it (AVX2/AVX-512 with
-march=native). -fno-trapping-math lets GCC turn the clamp in exp_f into vector
min/max without AVX-512 masks: on an AVX2-only CPU (AMD Zen 3) the loop stayed
scalar without it and ran 3x slower than the reference. It changes no result:
it only drops GCC's promise to keep floating-point traps, which nobody enables.

exp and erf are inline polynomial approximations: a Cephes-style
expf (about 1 ulp) and the Abramowitz-Stegun erf (|error| < 1.5e-7) that ATen's
own vectorised GELU uses, so results match the reference within ~1.5e-6.

CPU only: on CUDA inputs forward() raises RuntimeError. The extension is built at
import time; its name carries a hash of the source and flags, so an edited kernel never
reuses a stale build from TORCH_EXTENSIONS_DIR.
"""
import hashlib

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// e^x: x = n*ln2 + r, Cephes polynomial for e^r, 2^n from exponent bits.
static inline float exp_f(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // round(x / ln2) via the 1.5*2^23 trick: vectorises where floorf would not
  // (relies on IEEE evaluation order: never build this with -ffast-math).
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}

// Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), as in ATen's Vectorized<float>::erf.
static inline float erf_f(float x) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f;
  return std::copysign(1.0f - r * t * exp_f(-a * a), x);
}

// One row; restrict-qualified so GCC can vectorise without alias checks.
static void gated_gelu_row(const float* __restrict x, const float* __restrict g,
                           const float* __restrict scale, const float* __restrict shift,
                           float* __restrict out, int64_t n) {
  #pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    float h = x[j] * scale[j] + shift[j];
    float gelu = 0.5f * h * (1.0f + erf_f(h * 0.70710678118654752f));
    out[j] = gelu / (1.0f + exp_f(-g[j]));
  }
}

torch::Tensor gated_gelu(torch::Tensor x, torch::Tensor gate, torch::Tensor scale, torch::Tensor shift) {
  TORCH_CHECK(x.device().is_cpu() && gate.device().is_cpu(), "this candidate is CPU-only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && gate.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(x.sizes() == gate.sizes(), "x and gate must have the same shape");
  const int64_t H = x.size(-1);
  TORCH_CHECK(scale.numel() == H && shift.numel() == H, "scale/shift must match the last dim");
  auto xc = x.contiguous(), gc = gate.contiguous();
  auto sc = scale.contiguous().to(at::kFloat), sh = shift.contiguous().to(at::kFloat);
  auto out = torch::empty_like(xc);
  const float *px = xc.data_ptr<float>(), *pg = gc.data_ptr<float>();
  const float *ps = sc.data_ptr<float>(), *pb = sh.data_ptr<float>();
  float *po = out.data_ptr<float>();
  const int64_t rows = H ? xc.numel() / H : 0;
  #pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t i = 0; i < rows; ++i)
    gated_gelu_row(px + i * H, pg + i * H, ps, pb, po + i * H, H);
  return out;
}
"""

_CFLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp"]

_ext = load_inline(
    name="ks_gated_gelu_" + hashlib.sha256((_SRC + " ".join(_CFLAGS)).encode()).hexdigest()[:12],
    cpp_sources=_SRC,
    functions=["gated_gelu"],
    extra_cflags=_CFLAGS,
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.shift = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x, gate):
        if x.device.type != "cpu" or gate.device.type != "cpu":
            raise RuntimeError("this candidate is CPU-only")
        return _ext.gated_gelu(x, gate, self.scale.detach(), self.shift.detach())
