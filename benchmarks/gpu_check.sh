#!/usr/bin/env bash
# The checks a lent GPU gets; each step has its own time limit and writes its log under OUT, so a lease that
# ends early keeps what finished. Needs kernelscout installed (pip install -e . or a wheel on PYTHONPATH) and a
# CUDA device; the test suite itself never does.
#
#   OUT=/tmp/gpu-check [STEPS="gpu adversarial table"] [TABLE_S=420] [SUITE_S=240] bash benchmarks/gpu_check.sh
#
# Steps, run in the order STEPS names them (default: gpu adversarial table):
#   gpu          pytest -m gpu: the timer against triton.testing.do_bench, idle pauses, repeatability, side
#                streams, graph-replay rewrites.
#   adversarial  tests/test_adversarial.py with KSCOUT_TEST_DEVICE=cuda: every known cheat through the CUDA path.
#   suite        the whole test suite (-m "not gpu", pytest-xdist with SUITE_WORKERS=4) on the GPU host, where
#                device "auto" means cuda: what a developer with a GPU workstation sees when they run the tests.
#                Each failure's traceback goes to OUT/failures.txt as it happens (benchmarks/pytest_failnow.py).
#                tests/conftest.py gives each xdist process its share of the cores: before it, every sandbox
#                worker used all of them and the harness's own time limits tripped under load
#                (docs/gpu-validation.md, fifth lease). Without pytest-xdist the step runs in one process.
#   table        kscout optimize on the Triton examples (benchmarks/optimize_examples.py, TABLE_BUDGETS=5,10, the
#                best re-measured), run directories kept under OUT/runs, then kscout show on each.
# Results go to docs/gpu-validation.md and docs/benchmarks.md by hand, with the date and the device.
set -o pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
TABLE_S=${TABLE_S:-${1:-420}}
STEPS=${STEPS:-gpu adversarial table}
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-200}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "gpu_check.sh: no CUDA device is visible to torch here; run it on the GPU machine" >&2; exit 2; }
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv; date -u
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.txt"
# From outside the checkout, so `import kernelscout` finds the installed package, not the source folder.
PT="python3 -m pytest -q -p no:cacheprovider -o addopts= -c $R/pyproject.toml --rootdir $R -rs"

step_gpu() {
    (cd /tmp && timeout 180 $PT -m gpu "$R/tests/test_gpu_timing.py" "$R/tests/test_adversarial.py" "$R/tests/test_rewrites.py") 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
}
step_adversarial() {
    (cd /tmp && KSCOUT_TEST_DEVICE=cuda timeout 300 $PT "$R/tests/test_adversarial.py") 2>&1 | tee "$OUT/adversarial_cuda.log" | tail -5
}
step_suite() {
    local parallel=""
    python3 -c "import xdist" 2>/dev/null && parallel="-n ${SUITE_WORKERS:-4}"
    (cd /tmp && PYTHONPATH="$R/benchmarks${PYTHONPATH:+:$PYTHONPATH}" OUT="$OUT" timeout "${SUITE_S:-240}" \
        $PT -rfE -p pytest_failnow -p no:benchmark $parallel -m "not gpu" "$R/tests") 2>&1 | tee "$OUT/suite.log" | tail -25
}
step_table() {
    rm -rf "$OUT/runs"
    timeout "$TABLE_S" python3 "$R/benchmarks/optimize_examples.py" --device cuda --budgets "${TABLE_BUDGETS:-5,10}" \
        --problems softmax,gated_gelu --start-triton --one-search --keep "$OUT/runs" --out "$OUT/triton_table.md" 2>&1 | tee "$OUT/table.log" | grep "^|"
    for run in "$OUT"/runs/*; do
        case "$run" in *-baseline) continue ;; esac
        (cd /tmp && timeout 60 python3 -m kernelscout show "$run" --top 8) > "$OUT/show_$(basename "$run").txt" 2>&1
    done
}
for step in $STEPS; do
    declare -F "step_$step" >/dev/null || { echo "gpu_check.sh: no step '$step' (gpu, adversarial, suite, table)" >&2; exit 2; }
    "step_$step"
    echo "$step: done at $(( $(date +%s) - T0 )) s"
done
echo "all done: $(( $(date +%s) - T0 )) s; logs in $OUT"
