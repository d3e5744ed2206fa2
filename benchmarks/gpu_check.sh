#!/usr/bin/env bash
# The checks a lent GPU gets, in the order they are worth the time; each step has its own time limit and
# writes its log under OUT, so a lease that ends early keeps what finished. Needs kernelscout installed
# (pip install -e . or a wheel on PYTHONPATH) and a CUDA device; the test suite itself never does.
#
#   OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh [TABLE_SECONDS]
#
# 1. pytest -m gpu: the timer against triton.testing.do_bench, idle pauses, repeatability, side streams,
#    graph-replay rewrites.
# 2. tests/test_adversarial.py with KSCOUT_TEST_DEVICE=cuda: every known cheat through the CUDA path.
# 3. kscout optimize on the Triton examples (benchmarks/optimize_examples.py, budgets 5 and 10, the best
#    re-measured), run directories kept under OUT/runs, then kscout show on each.
# Results go to docs/gpu-validation.md and docs/benchmarks.md by hand, with the date and the device.
set -o pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
TABLE_S=${1:-420}
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-200}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "gpu_check.sh: no CUDA device is visible to torch here; run it on the GPU machine" >&2; exit 2; }
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv; date -u
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.txt"
# From outside the checkout, so `import kernelscout` finds the installed package, not the source folder.
PT="python3 -m pytest -q -p no:cacheprovider -o addopts= -c $R/pyproject.toml --rootdir $R -rs"
(cd /tmp && timeout 180 $PT -m gpu "$R/tests/test_gpu_timing.py" "$R/tests/test_adversarial.py" "$R/tests/test_rewrites.py") 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
echo "pytest -m gpu: $(( $(date +%s) - T0 )) s"
(cd /tmp && KSCOUT_TEST_DEVICE=cuda timeout 300 $PT "$R/tests/test_adversarial.py") 2>&1 | tee "$OUT/adversarial_cuda.log" | tail -5
echo "adversarial on cuda: $(( $(date +%s) - T0 )) s"
rm -rf "$OUT/runs"
timeout "$TABLE_S" python3 "$R/benchmarks/optimize_examples.py" --device cuda --budgets 5,10 --problems softmax,gated_gelu \
    --start-triton --one-search --keep "$OUT/runs" --out "$OUT/triton_table.md" 2>&1 | tee "$OUT/table.log" | grep "^|"
for run in "$OUT"/runs/*; do
    case "$run" in *-baseline) continue ;; esac
    (cd /tmp && timeout 60 python3 -m kernelscout show "$run" --top 8) > "$OUT/show_$(basename "$run").txt" 2>&1
done
echo "all done: $(( $(date +%s) - T0 )) s; logs in $OUT"
