"""How long `kscout` takes to answer the commands people type most between searches.

Run: python benchmarks/cli_latency.py [--repeats 7]
Prints a markdown section for docs/benchmarks.md.

Each command runs in a fresh process, as from a shell, `--repeats` times; the median wall time is
reported next to a bare `python -c pass` measured in the same run, so the ratio says what kscout adds
over starting Python on this machine. The runs read are made first: a recorded space (seconds to
search) and a copy of it, so `show A B` compares two runs.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from kernelscout.sandbox.replay import recorded_spaces_dir

KSCOUT = [sys.executable, "-m", "kernelscout"]


def _median_s(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--space", default=str(recorded_spaces_dir() / "convolution_A100.json.gz"))
    ap.add_argument("--budget", type=int, default=50, help="measurements of the run that `show` reads")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kscout-cli-latency-") as tmp:
        run = Path(tmp) / "run"
        subprocess.run([*KSCOUT, "optimize", "--space", args.space, "--budget", str(args.budget), "--run-dir", str(run)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        other = Path(tmp) / "copy"
        shutil.copytree(run, other)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "kscout --help": [*KSCOUT, "--help"],
            "kscout budget RUN": [*KSCOUT, "budget", str(run)],
            "kscout show RUN": [*KSCOUT, "show", str(run)],
            "kscout show RUN --json": [*KSCOUT, "show", str(run), "--json"],
            "kscout show RUN COPY": [*KSCOUT, "show", str(run), str(other)],
        }
        medians = {name: _median_s(cmd, args.repeats) for name, cmd in commands.items()}
    base = medians["python -c pass"]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("## Command-line latency\n")
    print("Command:\n\n```bash\npython benchmarks/cli_latency.py\n```\n")
    print(f"Measured {when} on {platform.machine()}, Python {platform.python_version()}; median of {args.repeats} fresh "
          f"processes each; the run read is `kscout optimize --space {Path(args.space).name} --budget {args.budget}`.\n")
    print("| command | median wall time | over `python -c pass` |")
    print("|---|---:|---:|")
    for name, s in medians.items():
        print(f"| `{name}` | {s:.2f} s | {s / base:.1f}x |")


if __name__ == "__main__":
    main()
