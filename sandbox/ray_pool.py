"""Measurement slots as Ray actors: one per GPU of a cluster (or per CPU slot without GPUs).

Each actor wraps a `MeasureSlot` (sandbox/slot.py). Jobs travel as JSON text with the problem and
candidate *source* inside, so the node needs kernelscout installed but not the run's files; a
recorded space is shipped once per actor through Ray's object store. The actor measures through the
same harness as a local measurement and spawns its own sandbox worker process for it, so candidate
code never runs in the actor's process. The actor holds no budget: the agent reserved the
measurement before dispatching it and settles it when the result returns.

Ray restarts a killed actor (`max_restarts=-1`) but never re-runs the lost call on its own
(`max_task_retries=0`): the dispatcher decides where a lost job goes next, so that it is retried
under its original reservation and paid for once. Ray is an optional extra (`pip install
'kernelscout[ray]'`); nothing else imports this module.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

try:
    import ray
    from ray import exceptions as ray_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("--ray needs Ray: pip install 'kernelscout[ray]' (or pip install ray)") from exc

from kernelscout.sandbox.slot import CodeJob, Job, MeasureSlot, ReplayJob, SlotResult, WorkerLost

# Errors that mean the worker, not the candidate, went away.
_LOST = (ray_errors.RayActorError, ray_errors.WorkerCrashedError, ray_errors.NodeDiedError, ray_errors.ObjectLostError)


@ray.remote
class MeasureActor:
    """A `MeasureSlot` on whatever node Ray placed it; Ray's GPU assignment (CUDA_VISIBLE_DEVICES) picks the device."""

    def __init__(self, name: str, device: str, threads: int, instance: str):
        import os

        from kernelscout.sandbox.pool import default_memory_bytes

        cores = os.cpu_count() or 1
        memory = None if device.startswith("cuda") else default_memory_bytes() * threads // cores
        self.slot = MeasureSlot(name, device, threads=threads, memory_bytes=memory, instance=instance)

    def where(self) -> str:
        return self.slot.label

    def run(self, kind: str, job_json: str, space: Optional[list] = None) -> str:
        job: Job = CodeJob.model_validate_json(job_json) if kind == "code" else ReplayJob.model_validate_json(job_json)
        space_bytes = None
        if isinstance(job, ReplayJob) and space and not self.slot.knows_space(job.space_sha, job.objective):
            space_bytes = ray.get(space[0])
        return self.slot.run(job, space_bytes).model_dump_json()

    def close(self) -> None:
        self.slot.close()


def connect(address: str) -> dict[str, float]:
    """Join the cluster at `address` (`auto`: the one this node belongs to; `local`: start one here)."""
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": False}
        if address == "local":
            kwargs["include_dashboard"] = False
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            raise ValueError(f"cannot reach a Ray cluster at {address!r} ({exc}); start one with `ray start --head`, "
                             "pass its address (ray://HOST:10001 or HOST:6379), or use --ray local") from None
    return ray.cluster_resources()


class RayPool:
    """N actors, one job at a time each; `call` blocks until the actor answers or is lost."""

    def __init__(self, address: str, workers: Optional[int], device: str, instance: str, start_timeout: float = 300.0):
        resources = connect(address)
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if device.startswith("cuda"):
            if gpus == 0:
                raise ValueError(f"the Ray cluster at {address!r} has no GPUs; use --device cpu or add GPU nodes")
            n, options, slot_device, have = workers or gpus, {"num_cpus": 1, "num_gpus": 1}, "cuda", gpus
        else:
            n, options, slot_device, have = workers or max(1, cpus), {"num_cpus": 1}, "cpu", cpus
        if n > have:
            what = "GPUs" if device.startswith("cuda") else "CPUs"
            raise ValueError(f"{n} workers need {n} {what}, but the Ray cluster has {have}; ask for at most {have}")
        self.device = slot_device
        self.names = [f"kscout-{instance}-{i}" for i in range(n)]
        self.actors = [
            MeasureActor.options(name=name, max_restarts=-1, max_task_retries=0, **options).remote(name, slot_device, 1, instance)
            for name in self.names
        ]
        try:
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=start_timeout)
        except ray_errors.GetTimeoutError:
            self.close()
            raise ValueError(f"the Ray cluster did not start {n} measurement actors within {start_timeout:g} s") from None
        self._spaces: dict[str, Any] = {}

    def call(self, index: int, job: Job) -> SlotResult:
        actor = self.actors[index]
        space = [self._space_ref(job)] if isinstance(job, ReplayJob) else None
        timeout = _timeout(job)
        ref = actor.run.remote(job.kind, job.model_dump_json(), space)
        try:
            return SlotResult.model_validate_json(ray.get(ref, timeout=timeout))
        except ray_errors.GetTimeoutError:
            ray.kill(actor, no_restart=False)  # Ray starts a fresh one; its sandbox worker is reaped on start
            raise WorkerLost(f"no answer within {timeout:g} s; the actor was restarted") from None
        except _LOST as exc:
            raise WorkerLost(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}") from None

    def recover(self, index: int, timeout: float = 600.0) -> bool:
        """Wait for Ray to restart a lost actor (on any node with room); False if it is gone for good."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.where[index] = ray.get(self.actors[index].where.remote(), timeout=60)
                return True
            except (ray_errors.ActorUnavailableError, ray_errors.GetTimeoutError):
                time.sleep(0.5)  # restarting
            except _LOST:
                return False  # died for good (restarts exhausted, or killed with no_restart)
        return False

    def _space_ref(self, job: ReplayJob):
        """Put the space file into the object store once; actors fetch it only if they lack it."""
        if job.space_sha not in self._spaces:
            self._spaces[job.space_sha] = ray.put(Path(job.space_path).read_bytes())
        return self._spaces[job.space_sha]

    def describe(self) -> str:
        what = "GPU" if self.device.startswith("cuda") else "CPU"
        nodes = sorted({w.split("@")[1].rsplit(":", 1)[0] for w in self.where})
        return f"{len(self.actors)} Ray {what} actors on {len(nodes)} node{'s' if len(nodes) > 1 else ''} ({', '.join(nodes)})"

    def close(self) -> None:
        closing = [a.close.remote() for a in self.actors]
        try:
            ray.get(closing, timeout=30)
        except Exception:  # a dead or stuck actor: killing it below is all that is left to do
            pass
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def _timeout(job: Job) -> float:
    """How long a healthy actor can take: the harness's own limits plus slack."""
    if isinstance(job, CodeJob):
        return job.harness.compile_timeout_s + job.harness.timeout_s + 180.0
    return job.delay_s + 120.0
