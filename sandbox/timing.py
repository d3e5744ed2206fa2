"""Timing of one call inside the worker, with the functions captured before any candidate loaded."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from kernelscout.sandbox import integrity

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H200: 60 MiB, B200: ~126 MiB)
# GPU busy time before each timed call. The harness leaves the GPU idle for milliseconds between
# calls (fresh inputs, pipes), and an idle GPU drops its clocks: on an H200 a 14 us kernel read as
# 0.22 ms after a 20 ms pause (docs/gpu-validation.md). Busy work ahead of the call brings them back.
GPU_WARM_MS = 2.0


class CallTimer:
    """Times single calls; on CUDA the L2 cache is flushed first and the end waits for every stream."""

    def __init__(self, device: torch.device, warm_ms: float = GPU_WARM_MS):
        self.device = device
        self.cuda = device.type == "cuda"
        self._flush_buffer = None
        self._warm_fills = 0
        self.fill_ms = 0.0  # GPU time of one fill of the flush buffer
        if self.cuda:
            self._flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            _reset_persisting_l2()
            self.fill_ms = self._measure_fill_ms()
            if warm_ms > 0:
                self._warm_fills = max(1, math.ceil(warm_ms / self.fill_ms))

    def _measure_fill_ms(self) -> float:
        """GPU time of one fill of the flush buffer at full clocks (the fastest of a burst)."""
        times = []
        for _ in range(20):
            start, end = integrity.cuda_event(enable_timing=True), integrity.cuda_event(enable_timing=True)
            integrity.event_record(start)
            self._flush_buffer.zero_()
            integrity.event_record(end)
            integrity.cuda_synchronize()
            times.append(integrity.event_elapsed(start, end))
        return max(min(times), 1e-3)

    def flush(self) -> None:
        if self._flush_buffer is not None:
            self._flush_buffer.zero_()

    def keep_busy(self) -> None:
        """Queue GPU_WARM_MS of work so the clocks are up when the timed call starts."""
        for _ in range(self._warm_fills):
            self._flush_buffer.zero_()

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float, float]:
        """Return (output, per-call timer ms, host wall ms around the call)."""
        if not self.cuda:
            t0 = integrity.perf_counter_ns()
            out = fn()
            t1 = integrity.perf_counter_ns()
            ms = (t1 - t0) / 1e6
            return out, ms, ms
        start = integrity.cuda_event(enable_timing=True)
        end = integrity.cuda_event(enable_timing=True)
        integrity.cuda_synchronize()  # nothing of the input preparation is still running
        h0 = integrity.perf_counter_ns()
        # No synchronise between the flush and the start event: the GPU is still clearing L2 while
        # Python launches the call's kernels, so the events time the kernels, not the host's launch
        # latency (as triton.testing.do_bench does). Synchronising here made a 15 us kernel read as
        # 45 us on an H200 (docs/gpu-validation.md).
        self.keep_busy()
        self.flush()
        integrity.event_record(start)
        out = fn()
        integrity.event_record(end)
        integrity.cuda_synchronize()  # device-wide: waits for side streams too
        h1 = integrity.perf_counter_ns()
        return out, integrity.event_elapsed(start, end), (h1 - h0) / 1e6


def _reset_persisting_l2() -> None:
    """A persisting-L2 access policy survives a memset flush (llm.c PR #852); set its carve-out to 0."""
    try:
        import ctypes

        cudart = ctypes.CDLL("libcudart.so")
        cuda_limit_persisting_l2_cache_size = 0x06
        cudart.cudaDeviceSetLimit(cuda_limit_persisting_l2_cache_size, ctypes.c_size_t(0))
    except OSError:
        pass
