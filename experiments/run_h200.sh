#!/usr/bin/env bash
# One GPU run of the C10 cells: checks first, then the grid, then the report, all under $OUT.
#   bash experiments/run_h200.sh OUT COMMIT LIMIT_S WORKERS STEPS LR [LR...]
# LIMIT_S bounds the whole script: the grid gets what the checks left (less 25 s for the report
# and the archive) and starts no job in its last 90 s.  GRID_ARGS (below) may hold several
# runs.  Results resume from the committed experiments/results and come back as
# results.tar.gz (the device returns at most 8 files).
set -u
START=$(date +%s)
OUT=$1
export VLA_VERIFY_COMMIT=$2
LIMIT=$3
WORKERS=$4
STEPS=$5
shift 5
export PYTHONUNBUFFERED=1
RESULTS=/tmp/experiment_results
mkdir -p "$RESULTS"
cp -r experiments/results/. "$RESULTS"/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
timeout 75 python3 experiments/gpu_check.py "$OUT" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check exit $? after $(( $(date +%s) - START )) s"
tail -c 1200 "$OUT/gpu_check.log"
GRID=$(( LIMIT - ($(date +%s) - START) - 25 ))
BUDGET=$(( GRID > 120 ? GRID - 90 : GRID / 4 ))
echo "grid: ${GRID} s, new jobs for ${BUDGET} s"
# GRID_ARGS: options for the grid's `run`, one line per run; the runs go side by side, each
# with WORKERS processes, their results in the one folder.
N=0
while IFS= read -r ARGS || [ -n "$ARGS" ]; do
  # shellcheck disable=SC2086
  timeout "$GRID" python3 -m vla_verify.experiments run --grid c10 --device cuda \
    --lrs "$@" --workers-per-device "$WORKERS" --time-budget "$BUDGET" \
    --train "steps=$STEPS" --results "$RESULTS" $ARGS > "$OUT/grid$N.log" 2>&1 &
  N=$(( N + 1 ))
done <<< "${GRID_ARGS:-}"
wait
echo "grids done after $(( $(date +%s) - START )) s"
for LOG in "$OUT"/grid*.log; do echo "== $LOG"; tail -c 1200 "$LOG"; done
timeout 15 python3 -m vla_verify.experiments report --results "$RESULTS" --no-plots | tail -4
# The device returns at most 8 files of 16 MiB each (64 MiB in all): the results without
# the checkpoints of paused jobs in one archive, the checkpoints in 15 MiB parts
# (`cat checkpoints.tar.part-* | tar -x -C experiments/results` joins them).
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" --exclude=checkpoints .
(cd "$RESULTS" && find . -path '*/checkpoints/*.pt' | tar -cf - -T -) \
  | split -b 15M -d -a 1 - "$OUT/checkpoints.tar.part-"
ls -la "$OUT"
