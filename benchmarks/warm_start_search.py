"""The search with and without a warm start from the same kernel recorded on other GPUs.

Run: python benchmarks/warm_start_search.py [--seeds 0-19] [--jobs 2] [--out DIR]

Every recorded space whose kernel was also recorded on another GPU is searched twice per seed, by
benchmarks/paired_search.py's `run`: cold (`kscout optimize --space FILE --budget 100 --seed S`) and warm
(the same with `--warm-start` from the kernel's other recorded spaces). Both read the fraction of the optimum
after 20, 50 and 100 measurements as the published table does. The runs are kept as JSON lines in DIR
(cold.jsonl, warm.jsonl), so a run cut short goes on where it stopped and `paired_search.py pair` can compare
either arm with another file. Prints a markdown table for docs/benchmarks.md: each space's means, the mean over
spaces, and the paired difference (warm minus cold, same space and seed) with its standard error, because one
search's result spreads over 0.6 to 1.0 of the optimum with its seed and the pairing removes that part.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paired_search  # noqa: E402  (a sibling script, not a package)

from kernelscout.sandbox.replay import recorded_spaces_dir, space_name  # noqa: E402

BUDGETS = "20,50,100"


def spaces_with_another_gpu(data: Path) -> list[Path]:
    return [f for f in sorted(data.glob("*.json*")) if paired_search.same_kernel_elsewhere(str(f))]


def table(cold: dict, warm: dict, spaces: list[Path]) -> list[str]:
    keys = sorted(set(cold) & set(warm))
    head = "| space | warm start from | " + " | ".join(f"cold @{b} | warm @{b}" for b in BUDGETS.split(",")) + " |"
    lines = [head, "|---|---|" + "---:|" * (2 * len(BUDGETS.split(",")))]
    means = []
    for f in spaces:
        ks = [k for k in keys if k[0] == space_name(f)]
        if not ks:
            continue
        c = [sum(cold[k][i] for k in ks) / len(ks) for i in range(3)]
        w = [sum(warm[k][i] for k in ks) / len(ks) for i in range(3)]
        means.append((c, w))
        others = ", ".join(space_name(o) for o in paired_search.same_kernel_elsewhere(str(f)))
        lines.append(f"| {space_name(f)} | {others} | " + " | ".join(f"{x:.3f} | {y:.3f}" for x, y in zip(c, w, strict=True)) + " |")
    mc = [sum(m[0][i] for m in means) / len(means) for i in range(3)]
    mw = [sum(m[1][i] for m in means) / len(means) for i in range(3)]
    lines.append("| **mean** | | " + " | ".join(f"**{x:.3f}** | **{y:.3f}**" for x, y in zip(mc, mw, strict=True)) + " |")
    diffs = [paired_search._mean_se([warm[k][i] - cold[k][i] for k in keys]) for i in range(3)]
    lines.append(f"\nwarm minus cold, paired over {len(keys)} runs (standard error): "
                 + " / ".join(f"{m:+.3f} ({se:.3f})" for m, se in diffs))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=recorded_spaces_dir())
    ap.add_argument("--seeds", default="0-19", help="seeds, as paired_search.py takes them (0-19, or 0-4,9)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="folder for the runs' JSON lines (default: a new temporary one)")
    args = ap.parse_args()
    spaces = spaces_with_another_gpu(args.data)
    if not spaces:
        raise SystemExit(f"{args.data}: no kernel is recorded on two GPUs there (no two spaces have the same kernel_name and parameters)")
    out = args.out or Path(tempfile.mkdtemp(prefix="kscout-warm-start-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    names = ",".join(str(f) for f in spaces)
    for label, method in (("cold", "kernelscout"), ("warm", "kernelscout:warm")):
        paired_search.main(["run", "--label", label, "--method", method, "--out", str(out / f"{label}.jsonl"),
                            "--spaces", names, "--seeds", args.seeds, "--budgets", BUDGETS, "--jobs", str(args.jobs)])
    cold, warm = (paired_search.load(str(out / f"{label}.jsonl"))[2] for label in ("cold", "warm"))
    print(f"seeds {args.seeds}; fraction of the optimum after {BUDGETS.replace(',', ' / ')} measurements; "
          f"wall {(time.perf_counter() - t0) / 60:.1f} min; runs in {out}\n")
    print("\n".join(table(cold, warm, spaces)))


if __name__ == "__main__":
    main()
