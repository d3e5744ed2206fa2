"""Timing of one call inside the worker, with the functions captured before any candidate loaded."""

from __future__ import annotations

from typing import Any, Callable

import torch

from kernelscout.sandbox import integrity

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H200: 60 MiB, B200: ~126 MiB)


class CallTimer:
    """Times single calls; on CUDA the L2 cache is flushed first and the end waits for every stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._flush_buffer = None
        if self.cuda:
            self._flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            _reset_persisting_l2()

    def flush(self) -> None:
        if self._flush_buffer is not None:
            self._flush_buffer.zero_()

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float, float]:
        """Return (output, per-call timer ms, host wall ms around the call)."""
        if not self.cuda:
            t0 = integrity.perf_counter_ns()
            out = fn()
            t1 = integrity.perf_counter_ns()
            ms = (t1 - t0) / 1e6
            return out, ms, ms
        self.flush()
        integrity.cuda_synchronize()
        start = integrity.cuda_event(enable_timing=True)
        end = integrity.cuda_event(enable_timing=True)
        h0 = integrity.perf_counter_ns()
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
