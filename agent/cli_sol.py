"""`kscout sol`: the speed-of-light bound of a problem, as a command.

Kept out of agent/cli.py so the command and its rendering live next to nothing else; cli.py calls
`register(app)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from kernelscout.agent.search_config import help_default, search_config

if TYPE_CHECKING:
    from kernelscout.tools.sol import SolBounds


def _time(ms: float) -> str:
    if ms >= 1 or ms == 0:
        return f"{ms:.4g} ms"
    return f"{ms * 1e3:.4g} µs" if ms >= 1e-3 else f"{ms * 1e6:.4g} ns"


def render_bounds(bounds: SolBounds) -> str:
    """The bound as a few aligned lines for a terminal."""
    from kernelscout.tools.sol import format_si

    on_cpu = bounds.device_key == "cpu"
    precision = bounds.precision + (" (TF32 off)" if bounds.precision == "fp32" and not on_cpu else "")
    if not bounds.flops:  # no counted FLOPs: no peak rate enters the bound
        precision = "- (no FLOPs counted; the bound is the memory side)"
    intensity = "-" if bounds.arithmetic_intensity is None else f"{bounds.arithmetic_intensity:.3g} FLOP/B"
    other = f"memory side {_time(bounds.memory_ms)}" if bounds.bound == "compute" else f"compute side {_time(bounds.compute_ms)}"
    rows = [
        ("problem", bounds.problem),
        ("device", f"{bounds.device} [{bounds.device_key}]"),
        ("precision", precision),
        ("FLOPs", format_si(bounds.flops, "FLOP") + (f" (counted on real {bounds.counted_on} tensors)" if bounds.counted_on != "meta" else "")
         # torch.utils.flop_counter counts matrix products, convolutions and attention; a bound can ignore the rest
         + ("" if bounds.flops else " of matmul, convolution or attention; element-wise work is not counted")),
        ("min bytes", (
            f"{format_si(bounds.min_bytes, 'B')} (inputs {format_si(bounds.input_bytes, 'B')}, "
            f"outputs {format_si(bounds.output_bytes, 'B')}, parameters {format_si(bounds.param_bytes, 'B')})"
        )),
        ("intensity", f"{intensity} (ridge {bounds.ridge_intensity:.3g} FLOP/B)"),
        ("peaks", f"{format_si(bounds.peak_flops, 'FLOP/s')}, {format_si(bounds.peak_bandwidth, 'B/s')} ({bounds.peaks_source})"),
        ("speed of light", f"{_time(bounds.time_ms)}, {bounds.bound}-bound ({other})"),
    ]
    lines = [f"{name:<15} {value}" for name, value in rows]
    lines += [f"{'note':<15} {note}" for note in bounds.notes]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `sol` command to a typer app."""

    @app.command("sol")
    def sol(
        problem: str = typer.Argument(..., help="KernelBench problem file (class Model, get_inputs, get_init_inputs), or a folder holding problem.py"),
        device: Optional[str] = typer.Option(
            None, help="auto, cpu, cuda[:N], or a GPU name: as torch reports it or short (H100, A100, A4000, MI250X, RTX_3090) "
            + help_default("device")
        ),
        tf32: bool = typer.Option(False, "--tf32", help="allow TF32 for fp32 matmuls (the harness pins it off)"),
        timeout: float = typer.Option(180.0, help="seconds allowed for counting the problem's FLOPs"),
        refresh_peaks: bool = typer.Option(False, "--refresh-peaks", help="on a CPU: measure its peak FLOP/s and bandwidth "
                                           "again (they are measured once and cached; run this on an idle machine)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Speed of light: the least time any kernel could take for PROBLEM on a device."""
        from kernelscout.sandbox.problem import InputFileError
        from kernelscout.tools.device_specs import UnknownDeviceError
        from kernelscout.tools.sol import SolRequest, sol_bounds

        device = search_config(as_json).pick("device", device)
        if refresh_peaks:
            from kernelscout.tools.sol import forget_cpu_peaks

            forget_cpu_peaks()  # measured again below if the bound is a CPU's (a GPU's come from its datasheet)
        try:
            bounds = sol_bounds(SolRequest(problem=problem, device=device, tf32=tf32, timeout_s=timeout))
        except (InputFileError, UnknownDeviceError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
        typer.echo(bounds.model_dump_json() if as_json else render_bounds(bounds))
