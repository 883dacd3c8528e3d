#!/usr/bin/env bash
# One GPU run of the C10 cells: checks first, then the grid, then the report, all under $OUT.
#   bash experiments/run_h200.sh OUT COMMIT GRID_BUDGET_S WORKERS STEPS LR [LR...]
# Results resume from the committed experiments/results and come back as results.tar.gz (the
# device returns at most 8 files).  Every stage has its own timeout, so the archive is written
# even when the grid runs out of time.
set -u
OUT=$1
export VLA_VERIFY_COMMIT=$2
BUDGET=$3
WORKERS=$4
STEPS=$5
shift 5
export PYTHONUNBUFFERED=1
RESULTS=/tmp/experiment_results
mkdir -p "$RESULTS"
cp -r experiments/results/. "$RESULTS"/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
timeout 100 python3 experiments/gpu_check.py "$OUT" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check exit $?"
tail -c 1500 "$OUT/gpu_check.log"
timeout $((BUDGET + 90)) python3 -m vla_verify.experiments run --grid c10 --device cuda \
  --lrs "$@" --workers-per-device "$WORKERS" --time-budget "$BUDGET" \
  --train "steps=$STEPS" --results "$RESULTS" > "$OUT/grid.log" 2>&1
echo "grid exit $?"
tail -c 3000 "$OUT/grid.log"
timeout 60 python3 -m vla_verify.experiments report --results "$RESULTS" --no-plots
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" .
ls -la "$OUT"
