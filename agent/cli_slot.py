"""`kscout slot`: the far end of a device plugin. Measures one job shipped to this machine and prints its result.

A lab's device plugin (README, "Plugging in a surrogate, a policy or a device") decides where a search's jobs run;
the simplest plugin pipes each job to `ssh gpu-box kscout slot --device cuda` and reads the answer back. The job
is plain JSON (the problem's and the candidate's source text and the harness settings, or a recorded space's
configuration), so nothing but kscout itself needs to be installed there. The candidate runs in that machine's
sandbox workers, exactly as under `kscout measure`; no budget is kept here, since the agent that shipped the job
reserved its measurement before it did and settles it when this answer comes back.
"""

from __future__ import annotations

import os
import sys

import typer


def register(app: typer.Typer) -> None:
    @app.command(name="slot")
    def slot_command(
        device: str = typer.Option("auto", "--device", help="this machine's device the job measures on: auto, cpu, cuda or cuda:N"),
    ) -> None:
        """Measure one job read from stdin (JSON, as a device plugin ships it) on this machine; print the result as JSON.

        The far end of a device plugin: `ssh gpu-box kscout slot --device cuda` with the job on stdin. Candidate code
        runs in this machine's sandbox workers, as for `kscout measure`."""
        from pydantic import TypeAdapter, ValidationError

        from kernelscout.sandbox.problem import InputFileError
        from kernelscout.sandbox.slot import Job, MeasureSlot
        from kernelscout.tools.measure import resolve_device

        text = sys.stdin.read()
        try:
            job = TypeAdapter(Job).validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            typer.echo(f"kscout slot: stdin is not a job (a CodeJob's or ReplayJob's JSON, as kernelscout.sandbox.slot "
                       f"defines them): {'.'.join(str(p) for p in first['loc'])}: {first['msg']}", err=True)
            raise typer.Exit(2) from None
        try:
            here = resolve_device(device)
        except InputFileError as exc:
            typer.echo(f"kscout slot: {exc}", err=True)
            raise typer.Exit(2) from None
        if here not in ("cpu",) and not here.startswith("cuda"):
            typer.echo(f"kscout slot: --device {device}: give this machine's own device (cpu, cuda or cuda:N)", err=True)
            raise typer.Exit(2)
        # its own instance name: a slot reaps the worker that an earlier slot *of the same name* left behind, and
        # several `kscout slot` processes run at once on one machine (a plugin's workers)
        slot = MeasureSlot("slot", here, instance=f"cli-{os.getpid()}")
        try:
            result = slot.run(job)
        finally:
            slot.close()
        typer.echo(result.model_dump_json())
