"""Measure on many workers at once, under the one budget of the run directory.

The budget never leaves the agent: `measure()` and `measure_replay()` reserve a measurement in the
run's ledger *before* they hand the job to a `Dispatcher`, and settle it when the result returns
(tools/measure.py, `ledgered`). The dispatcher only decides *where* a job runs:

* `LocalSlots`: N measurement slots in this process (`--workers N`), each driving its own sandbox
  worker process (one per GPU on a GPU machine, CPU workers otherwise);
* `RayPool` (sandbox/ray_pool.py): one Ray actor per GPU (or per CPU slot) of a cluster (`--ray`);
* `PluginBackend`: an installed package's device (`--device NAME`, entry point group kernelscout.devices), which
  ships each job where the lab measures (to `kscout slot` on a GPU machine over ssh, say) and hands back its result.

A worker that is lost mid-job (its actor or node died, or stopped answering) is not a verdict on the
candidate: the job runs again on another worker *under the same reservation*, so the measurement is
paid for once. After `max_attempts` losses the measurement is recorded as crashed and charged once,
so a candidate that keeps killing its workers cannot loop forever.

Every job leaves a trace in the run directory, wherever it ran: `dispatch` and `worker_lost` events
in events.jsonl, the sandbox worker's output in workers/<worker>.log, and a JSON crash report in
crashes/ for a crash, a timeout or a lost worker.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from kernelscout.sandbox.harness import HarnessConfig
from kernelscout.sandbox.problem import SourceFile
from kernelscout.sandbox.slot import CodeJob, Job, MeasureSlot, ReplayJob, SlotResult, WorkerLost, WorkersGone, file_sha
from kernelscout.tools.rundir import RunDir
from kernelscout.tools.schema import Measurement, MeasureStatus


LOST_JOBS_IN_A_ROW = 2  # jobs lost on every attempt, one after another, that say the device itself is down


class Backend(Protocol):
    """Where jobs run. `call` blocks until worker `index` returns, or raises WorkerLost."""

    names: list[str]

    def call(self, index: int, job: Job) -> SlotResult: ...

    def recover(self, index: int) -> bool:
        """Block until lost worker `index` can take jobs again (True) or is gone for good (False)."""
        ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class LocalSlots:
    """N slots in this process. Threads only wait on pipes; the candidates run in the slots' sandbox workers."""

    def __init__(self, n: int, device: str = "cpu", instance: str = "local"):
        from kernelscout.sandbox.pool import default_memory_bytes, default_threads

        gpus = _local_gpus() if device.startswith("cuda") else 0
        if device.startswith("cuda") and gpus == 0:
            raise ValueError("no CUDA device is visible here; use --device cpu")
        cores = default_threads()
        self.devices = [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(n)]
        # CPU slots share the cores and the memory; GPU slots each get a device of their own
        threads = max(1, cores // n)
        memory = default_memory_bytes() // (n if not gpus else 1)
        shares = cpu_shares(n, threads) if not gpus and n > 1 else [()] * n
        self.slots = [MeasureSlot(f"local-{i}", d, threads=threads, memory_bytes=memory, instance=instance, cpus=shares[i])
                      for i, d in enumerate(self.devices)]
        self.names = [s.name for s in self.slots]
        self.threads = threads

    def call(self, index: int, job: Job) -> SlotResult:
        return self.slots[index].run(job)

    def recover(self, index: int) -> bool:
        return True  # a thread of this process is never lost on its own; its sandbox worker is replaced per job

    def describe(self) -> str:
        if self.devices[0].startswith("cuda"):
            return f"{len(self.slots)} local workers on {', '.join(self.devices)}"
        pinned = self.slots[0].cpus
        where = f", pinned to cores {' | '.join(_cores_text(slot.cpus) for slot in self.slots)}" if pinned else ""
        return f"{len(self.slots)} local CPU worker{'s' if len(self.slots) > 1 else ''} ({self.threads} thread{'s' if self.threads > 1 else ''} each{where})"

    def close(self) -> None:
        for slot in self.slots:
            slot.close()


def cpu_shares(n: int, threads: int) -> list[tuple[int, ...]]:
    """Each of `n` CPU slots gets `threads` cores of this process's own, none shared while there are enough.
    Why pin rather than only cap the thread count: a worker capped at 2 threads but free to run on every
    core lets a candidate raise its count inside its call (the reference then had 2 cores, the candidate
    all), and honest workers' threads wander onto each other's cores and disturb each other's timings."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cores:  # no affinity on this platform: threads are capped, not pinned
        return [()] * n
    return [tuple(cores[(i * threads + j) % len(cores)] for j in range(threads)) for i in range(n)]


class PluginBackend:
    """An installed package's device, behind the checks the dispatcher relies on.

    The plugin is the lab's own code, trusted as installed code is; what it must provide is checked here, so that a
    plugin that breaks its contract stops the search with its name and what it broke (a `PluginError`: the reservation
    stays in the ledger and `kscout resume` measures it once the plugin is fixed) instead of a traceback. Only
    `WorkerLost` from `call` means "try another worker": anything else the plugin raises is the plugin's fault."""

    def __init__(self, name: str, workers: Optional[int] = None):
        from kernelscout.tools import plugins

        self.plugin = name
        self.kind = plugins.device_kind(name)[0]
        self.inner = plugins.build(plugins.DEVICES, name, workers)
        names = getattr(self.inner, "names", None)
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise self._broke(f"its `names` must be a non-empty list of worker names, not {names!r}")
        missing = [m for m in ("call", "describe", "close") if not callable(getattr(self.inner, m, None))]
        if missing:
            raise self._broke(f"it has no {', '.join(missing)} method")
        self.names = names

    def _broke(self, what: str) -> Exception:
        from kernelscout.tools.plugins import PluginError

        return PluginError(f"the device {self.plugin!r} {what} (README, \"Plugging in a surrogate, a policy or a device\")")

    def call(self, index: int, job: Job) -> SlotResult:
        try:
            result = self.inner.call(index, job)
        except WorkerLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a third party's error, named with what to fix
            raise self._broke(f"failed measuring a job on worker {self.names[index]!r}: {type(exc).__name__}: {exc} (raise "
                              "kernelscout.sandbox.slot.WorkerLost for a worker that went away, so the job goes to another)") from None
        if not isinstance(result, SlotResult):
            try:
                result = (SlotResult.model_validate_json(result) if isinstance(result, (str, bytes))
                          else SlotResult.model_validate(result))
            except ValueError as exc:
                raise self._broke(f"returned {type(result).__name__} from call(), not a SlotResult (or its JSON, as `kscout "
                                  f"slot` prints it): {str(exc).splitlines()[0]}") from None
        # named as the user chose the device, as the ledger keys it; where it ran is in its checks ("measured on ...")
        result.measurement.device = self.plugin
        return result

    def recover(self, index: int) -> bool:
        recover = getattr(self.inner, "recover", None)
        return bool(recover(index)) if callable(recover) else False

    def describe(self) -> str:
        return f"device {self.plugin} ({self.kind}): {self.inner.describe()}"

    def close(self) -> None:
        self.inner.close()


def _cores_text(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


class Dispatcher:
    """Hands each job to a free worker, retries a lost worker's job on another one, and files its logs.

    Thread-safe: the search loop calls it from one thread per job in flight.
    """

    def __init__(self, backend: Backend, run: RunDir, max_attempts: int = 3, replay_delay_s: float = 0.0):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend, self.run, self.max_attempts, self.replay_delay_s = backend, run, max_attempts, replay_delay_s
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(len(backend.names)):
            self._free.put(i)
        self._shas: dict[str, str] = {}
        self._lock = threading.Lock()
        self._retired: set[int] = set()
        self._lost_in_a_row = 0  # jobs that ended lost on every attempt, one after another

    @property
    def size(self) -> int:
        return len(self.backend.names)

    def describe(self) -> str:
        return self.backend.describe()

    # -- the hooks measure() and measure_replay() call between reserve and settle ---------------
    def code(self, problem: SourceFile, candidate: SourceFile, config: HarnessConfig) -> Measurement:
        return self.run_job(CodeJob.from_files(problem, candidate, config), label=candidate.path.name)

    def replay(self, space: Any, config: dict, reference: Optional[dict]) -> Callable[[int], Measurement]:
        path = str(Path(space.path).resolve())
        with self._lock:
            sha = self._shas.get(path) or self._shas.setdefault(path, file_sha(path))

        def execute(seed: int) -> Measurement:
            job = ReplayJob(space_path=path, space_sha=sha, objective=space.objective_choice, config=dict(config),
                            reference=reference, seed=seed, delay_s=self.replay_delay_s)
            return self.run_job(job, label=json.dumps(config, default=str))

        return execute

    # -- dispatching -----------------------------------------------------------------------------
    def run_job(self, job: Job, label: str = "") -> Measurement:
        """Run one job to a result. Only WorkerLost is retried: any verdict on the candidate is final."""
        losses: list[str] = []
        lost_on: set[str] = set()
        for attempt in range(1, self.max_attempts + 1):
            index = self._next_free(losses)
            name = self.backend.names[index]
            self.run.event("dispatch", worker=name, job=job.kind, candidate=label, attempt=attempt)
            try:
                result = self.backend.call(index, job)
            except WorkerLost as exc:
                losses.append(f"{name}: {exc}")
                lost_on.add(name)
                self.run.event("worker_lost", worker=name, candidate=label, attempt=attempt, reason=str(exc))
                self._crash_report(name, label, job, {"lost": str(exc), "attempt": attempt})
                # the retry takes the next free worker; this one rejoins once it is back (Ray restarts it)
                threading.Thread(target=self._recover, args=(index,), daemon=True).start()
                continue
            self._free.put(index)
            with self._lock:
                self._lost_in_a_row = 0
            self._file(result, label, job)
            if losses:
                result.measurement.warnings.append(f"measured again after losing {len(losses)} worker(s): " + "; ".join(losses))
            return result.measurement
        with self._lock:
            self._lost_in_a_row += 1
            down = self._lost_in_a_row >= LOST_JOBS_IN_A_ROW
        if down:
            raise WorkersGone(f"the workers of {self.describe()} were lost on every attempt at {LOST_JOBS_IN_A_ROW} jobs in a "
                              f"row ({'; '.join(losses)}): the device looks down, so this job keeps its reservation unspent")
        lost = f"{len(losses)} workers" if len(lost_on) == len(losses) else f"{len(lost_on)} worker(s) {len(losses)} times"
        message = (f"lost {lost} while measuring this candidate ({'; '.join(losses)}); recorded as crashed and charged once, "
                   "since it may have run on the device each time")
        device = job.harness.device if isinstance(job, CodeJob) else "replay"
        return Measurement(status=MeasureStatus.crashed, charged=True, message=message, device=device)

    def _next_free(self, losses: Optional[list[str]] = None) -> int:
        while True:
            try:
                return self._free.get(timeout=1.0)
            except queue.Empty:
                if len(self._retired) == self.size:
                    lost = f" (lost: {'; '.join(losses)})" if losses else ""
                    raise WorkersGone(f"every measurement worker of {self.describe()} is gone{lost}") from None

    def _recover(self, index: int) -> None:
        try:
            back = self.backend.recover(index)
        except Exception:  # noqa: BLE001 - a worker we cannot even ask about is as good as gone
            back = False
        if back:
            self._free.put(index)
        else:
            self._retired.add(index)
            self.run.event("worker_retired", worker=self.backend.names[index])

    def _file(self, result: SlotResult, label: str, job: Job) -> None:
        """Put a worker's output and any crash into the run directory, as for a local measurement."""
        m = result.measurement
        logs = self.run.path / "workers"
        logs.mkdir(exist_ok=True)
        header = f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {result.worker} {label} -> {m.status.value}\n"
        with open(logs / f"{_file_name(result.worker.split('@')[0])}.log", "a") as f:
            f.write(header + (result.log if result.log.endswith("\n") or not result.log else result.log + "\n"))
        if m.status in (MeasureStatus.crashed, MeasureStatus.timeout):
            self._crash_report(result.worker, label, job, {"status": m.status.value, "message": m.message, "log": result.log})

    def _crash_report(self, worker: str, label: str, job: Job, details: dict) -> None:
        folder = self.run.path / "crashes"
        folder.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = folder / f"{stamp}-{_file_name(worker.split('@')[0])}-{time.monotonic_ns() % 10**9}.json"
        report = {"worker": worker, "candidate": label, "job": job.kind, "time": time.time(), **details}
        if isinstance(job, CodeJob):
            report["candidate_source"] = job.candidate_source
        path.write_text(json.dumps(report, indent=2, default=str))

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Dispatcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class InlineExecutor(Executor):
    """One measurement at a time, in the caller's own thread, so Ctrl-C interrupts the measurement itself
    (its reservation stays and is adopted on resume) instead of waiting for it to finish."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future, as a thread pool would
            future.set_exception(exc)
        return future


def _file_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:80]


def open_dispatcher(run: RunDir, device: str, workers: Optional[int] = None, ray_address: Optional[str] = None,
                    replay_delay_s: float = 0.0, max_attempts: int = 3) -> Dispatcher:
    """`--workers N` alone: N local slots. `--ray ADDRESS|auto|local`: actors on a Ray cluster (N, or one per GPU).
    `device` an installed package's device: its workers (N passed on to its factory, which may ignore it)."""
    import uuid

    instance = uuid.uuid4().hex[:8]
    if workers is not None and workers < 1:
        raise ValueError("--workers must be at least 1")
    from kernelscout.tools.plugins import is_device_plugin

    if is_device_plugin(device):
        if ray_address:
            raise ValueError(f"--device {device} is an installed package's device, which decides where its jobs run; leave --ray out")
        backend: Backend = PluginBackend(device, workers)
    elif ray_address:
        from kernelscout.sandbox.ray_pool import RayPool

        backend = RayPool(ray_address, workers, device, instance=instance)
    else:
        backend = LocalSlots(workers or 1, device, instance=instance)
    run.event("workers", backend=backend.describe(), names=backend.names)
    return Dispatcher(backend, run, max_attempts=max_attempts, replay_delay_s=replay_delay_s)
