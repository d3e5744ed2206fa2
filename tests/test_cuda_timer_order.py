"""The order of work around a timed CUDA call, checked without a GPU.

CI has no GPU, and the two faults a lent H200 showed (docs/gpu-validation.md) came from this
order: a synchronise between the L2 flush and the start event put Python's launch latency inside
the timing, and nothing kept the GPU busy before the call, so it ran at idle clocks. This test
replays CallTimer against a recording stand-in for the CUDA calls.
"""

import torch

from kernelscout.sandbox import timing


class _Buffer:
    def __init__(self, log):
        self.log = log

    def zero_(self):
        self.log.append("fill")


class _Event:
    def __init__(self, log, **_):
        self.log = log


def _recording_timer(monkeypatch, log, warm_fills):
    monkeypatch.setattr(timing.integrity, "cuda_synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(timing.integrity, "cuda_event", lambda **kw: _Event(log, **kw))
    monkeypatch.setattr(timing.integrity, "event_record", lambda e: log.append("event"))
    monkeypatch.setattr(timing.integrity, "event_elapsed", lambda a, b: 0.01)
    timer = object.__new__(timing.CallTimer)  # its constructor allocates on the GPU
    timer.device, timer.cuda = torch.device("cuda"), True
    timer._flush_buffer, timer._warm_fills = _Buffer(log), warm_fills
    return timer


def test_the_gpu_is_kept_busy_and_never_synchronised_between_the_flush_and_the_start_event(monkeypatch):
    log = []
    timer = _recording_timer(monkeypatch, log, warm_fills=3)
    out, ms, _ = timer(lambda: log.append("call") or "result")
    assert out == "result" and ms == 0.01
    # inputs settled; 3 warm-up fills and the flush queued back to back; start; call; end; wait for all streams
    assert log == ["sync", "fill", "fill", "fill", "fill", "event", "call", "event", "sync"]

