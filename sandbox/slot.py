"""One measurement slot: a device and the warm sandbox worker that measures on it, one job at a time.

A slot is what a scale-out worker *is*, whether it is a thread of the agent (`--workers N`) or a
Ray actor on another node (`--ray`). Jobs carry everything a slot needs as plain data (problem and
candidate *source text*, the harness settings, or a replay configuration), so a job can cross a
process or machine boundary as JSON; the slot writes the sources into its own scratch folder and
measures them through the same harness as a local measurement. Candidate code still runs only in
the sandbox worker process the slot spawns, never in the slot's own process.

Slots keep no budget: the dispatcher reserves a measurement before it hands a job to a slot and
settles it when the result comes back (agent/dispatch.py).
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field

from kernelscout.sandbox.harness import HarnessConfig, run_measurement
from kernelscout.sandbox.pool import WorkerPool, WorkerProcess, kill_tree
from kernelscout.sandbox.problem import InputFileError, SourceFile, load_candidate, load_problem
from kernelscout.sandbox.objectives import Objective
from kernelscout.sandbox.scratch import ScratchDir
from kernelscout.tools.schema import Measurement, MeasureStatus



class CodeJob(BaseModel):
    """A candidate to verify and time against its problem, shipped as source text."""

    kind: Literal["code"] = "code"
    problem_name: str
    problem_source: str
    candidate_name: str
    candidate_source: str
    harness: HarnessConfig

    @classmethod
    def from_files(cls, problem: SourceFile, candidate: SourceFile, harness: HarnessConfig) -> "CodeJob":
        return cls(problem_name=problem.path.name, problem_source=problem.source, candidate_name=candidate.path.name,
                   candidate_source=candidate.source, harness=harness)


class ReplayJob(BaseModel):
    """A configuration of a recorded space, answered by the replay device with a fixed seed."""

    kind: Literal["replay"] = "replay"
    space_path: str
    space_sha: str = Field(description="sha256 of the space file, so a remote slot can cache what it was sent")
    objective: Objective = Field("file", description="as `ReplaySpace.load` takes it (`--objective`)")
    config: dict[str, Any]
    reference: Optional[dict[str, Any]] = None
    seed: int
    delay_s: float = Field(0.0, ge=0, description="simulated device time per measurement (scaling benchmarks only)")


Job = Union[CodeJob, ReplayJob]


class WorkerLost(Exception):
    """The worker went away mid-job (its actor or node died, or stopped answering); the job itself is fine."""


class WorkersGone(RuntimeError):
    """No worker is left to measure on, or the workers were lost on every attempt at two jobs in a row: the device,
    not the candidates, has failed. The job in hand keeps its reservation (in flight), which the next request for the
    same measurement adopts (`kscout resume` once the workers are back), so a dead device does not spend the budget on
    jobs it never ran."""


class SlotResult(BaseModel):
    """A measurement and where it was taken, with the sandbox worker's output while it ran."""

    measurement: Measurement
    worker: str = Field(description="slot name, host and pid, e.g. 'local-0@host:1234'")
    log: str = Field("", description="what the sandbox worker printed during this measurement")


def file_sha(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _LoggedPool(WorkerPool):
    """A one-worker pool that keeps the part of the worker's log written during the current job.

    The worker's log lives in its scratch folder, which is deleted when a crashed worker is
    replaced; reading it at release time keeps the crash output for the run directory.
    """

    def __init__(self, on_spawn, **kw: Any):
        super().__init__(**kw)
        self._on_spawn = on_spawn
        self._offset = 0
        self.captured = ""

    def acquire(self, device: str, start_timeout: float = 120.0) -> WorkerProcess:
        worker = super().acquire(device, start_timeout)
        self._on_spawn(worker.pid)
        self._offset = worker.log_size()
        return worker

    def release(self, worker: WorkerProcess, healthy: bool) -> None:
        self.captured = worker.log_since(self._offset)
        super().release(worker, healthy)


class MeasureSlot:
    """A device plus one warm sandbox worker. Thread-safe by serialising: one job at a time.

    `device` is the slot's own device (``cuda:1`` for the second GPU of a node); a job names only
    the device class, so the same measurement key holds whichever slot measures it.
    """

    def __init__(self, name: str, device: str = "cpu", threads: Optional[int] = None, memory_bytes: Optional[int] = None,
                 instance: str = "", cpus: Sequence[int] = ()):
        self.name, self.device, self.cpus = name, device, tuple(cpus)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._lock = threading.Lock()
        self._scratch = ScratchDir("slot", _safe(name))  # swept by a later slot if this one is killed
        # `instance` is unique per dispatcher, so a restarted Ray actor finds its predecessor's file
        # and two runs on one machine never touch each other's workers
        self._pidfile = Path(tempfile.gettempdir()) / f"kscout-slot-{_safe(instance)}-{_safe(name)}.pgid"
        _reap_orphan(self._pidfile)  # a previous incarnation of this slot was killed mid-measurement
        self._pool = _LoggedPool(self._remember, threads=threads, memory_bytes=memory_bytes, cpus=cpus)
        self._spaces: dict[str, Any] = {}

    @property
    def label(self) -> str:
        return f"{self.name}@{self.host}:{self.pid}"

    def run(self, job: Job, space_bytes: Optional[bytes] = None) -> SlotResult:
        with self._lock:
            if isinstance(job, ReplayJob):
                return SlotResult(measurement=self._replay(job, space_bytes), worker=self.label)
            self._pool.captured = ""
            m = self._code(job)
            return SlotResult(measurement=m, worker=self.label, log=self._pool.captured)

    def _code(self, job: CodeJob) -> Measurement:
        config = job.harness.model_copy(update={"device": self.device})
        try:
            problem, candidate = self._sources(job)
        except InputFileError as exc:  # the agent checked these files already; text damaged in transit
            return Measurement(status=MeasureStatus(exc.kind), message=str(exc), device=self.device)
        m = run_measurement(self._pool, problem, candidate, config)
        m.checks.append(f"measured on {self.label}")
        return m

    def _sources(self, job: CodeJob) -> tuple[SourceFile, SourceFile]:
        """Write the shipped sources into this slot's scratch folder, named by content."""
        folder = self._scratch.path / hashlib.sha256((job.problem_source + "\0" + job.candidate_source).encode()).hexdigest()[:16]
        folder.mkdir(exist_ok=True)
        p, c = folder / _safe(job.problem_name, ".py"), folder / ("candidate_" + _safe(job.candidate_name, ".py"))
        for path, text in ((p, job.problem_source), (c, job.candidate_source)):
            if not path.exists():
                path.write_text(text)
        return load_problem(p), load_candidate(c)

    def _replay(self, job: ReplayJob, space_bytes: Optional[bytes]) -> Measurement:
        import numpy as np

        from kernelscout.sandbox.replay import ReplayDevice

        device = ReplayDevice(self._space(job, space_bytes))
        started = time.monotonic()
        m = device.measure(job.config, np.random.default_rng(job.seed), reference=job.reference)
        if job.delay_s and m.charged:
            time.sleep(job.delay_s)  # stands in for device time; see benchmarks/workers_scaling.py
        m.wall_s = round(time.monotonic() - started, 3)
        return m

    def _space(self, job: ReplayJob, space_bytes: Optional[bytes]):
        from kernelscout.sandbox.replay import ReplaySpace

        key = f"{job.space_sha}:{job.objective}"
        if key not in self._spaces:
            path = Path(job.space_path)
            if space_bytes is not None:  # shipped by the dispatcher: this node may not have the file
                path = self._scratch.path / f"{job.space_sha[:16]}-{Path(job.space_path).name}"
                path.write_bytes(space_bytes)
            self._spaces[key] = ReplaySpace.load(path, job.objective)
        return self._spaces[key]

    def knows_space(self, sha: str, objective: str = "file") -> bool:
        return f"{sha}:{objective}" in self._spaces

    def _remember(self, pgid: int) -> None:
        self._pidfile.write_text(str(pgid))

    def close(self) -> None:
        with self._lock:
            self._pool.close()
            self._pidfile.unlink(missing_ok=True)
            self._scratch.remove()


def _safe(name: str, suffix: str = "") -> str:
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(name).name)[:80] or "file"
    return stem if not suffix or stem.endswith(suffix) else stem + suffix


def _reap_orphan(pidfile: Path) -> None:
    """Kill the sandbox worker a killed slot left behind (it has its own session, so it outlives its parent)."""
    try:
        pgid = int(pidfile.read_text())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if b"kernelscout.sandbox.worker" in cmdline:  # never a recycled pid that is now something else
        kill_tree(pgid)  # with what its candidate started, in other sessions too
    pidfile.unlink(missing_ok=True)
