#!/usr/bin/env bash
# One GPU run of experiment grids: checks first, then the grids, then the report, all under $OUT.
#   bash experiments/run_h200.sh OUT COMMIT LIMIT_S WORKERS STEPS LR [LR...]
# LIMIT_S bounds the whole script: the grids get what the checks left (less 30 s for the report
# and the archives) and start no stack in their last 90 s.  GRID_ARGS (below) holds the grid
# selections, one per line (default: the c10 cells); TRAIN_ARGS more --train settings (e.g.
# matmul_precision=high); CHECK_ARGS gpu_check's (--no-timings).  Results resume from the committed
# experiments/results and from what an earlier call on the same (warm) machine left in
# /tmp/experiment_results, paused stacks included.
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
LOGS=/tmp/experiment_logs/$(date +%s)
mkdir -p "$RESULTS" "$LOGS"
cp -r experiments/results/. "$RESULTS"/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOGS/machine.txt" 2>&1
if [ -z "${SKIP_CHECK:-}" ]; then
  # shellcheck disable=SC2086
  timeout 150 python3 experiments/gpu_check.py "$LOGS" ${CHECK_ARGS:-} > "$LOGS/gpu_check.log" 2>&1
  echo "gpu_check exit $? after $(( $(date +%s) - START )) s"
  tail -c 2500 "$LOGS/gpu_check.log"
fi
GRID=$(( LIMIT - ($(date +%s) - START) - 30 ))
BUDGET=$(( GRID > 120 ? GRID - 90 : GRID / 4 ))
echo "grids: ${GRID} s, new stacks for ${BUDGET} s"
# GRID_ARGS: one grid selection per line (--grid G [--sizes …] [--mixers …] [--model …]
# [--train …]), all run as one plan: one queue of stacks, the longest first, WORKERS
# processes on the GPU.  Without it, the c10 cells.
printf '%s\n' "${GRID_ARGS:---grid c10}" > "$LOGS/plan.txt"
# shellcheck disable=SC2086
timeout "$GRID" python3 -m vla_verify.experiments run --plan "$LOGS/plan.txt" --device cuda \
  --lrs "$@" --workers-per-device "$WORKERS" --time-budget "$BUDGET" \
  --train "steps=$STEPS" ${TRAIN_ARGS:-} --results "$RESULTS" > "$LOGS/grid.log" 2>&1 &
GRID_PID=$!
nvidia-smi dmon -s u -c $(( GRID / 10 )) -d 10 > "$LOGS/dmon.log" 2>&1 &
DMON_PID=$!
# The monitor samples for the grids' whole allowance; a plan that finishes early stops it.
wait "$GRID_PID"
kill "$DMON_PID" 2>/dev/null
wait "$DMON_PID" 2>/dev/null
echo "grids done after $(( $(date +%s) - START )) s"
tail -c 1500 "$LOGS/grid.log"
timeout 20 python3 -m vla_verify.experiments report --results "$RESULTS" --no-plots | tail -6
# The device returns at most 8 files, 64 MiB in all: the logs in one archive, the results
# without checkpoints in another, and the checkpoints of paused stacks (about 10 MiB a stack of
# three) in at most three 15 MiB parts (`cat checkpoints.tar.part-* | tar -x -C
# experiments/results` joins them; a stack cut off at the end starts again).  A next call on
# the still-warm machine finds them all in $RESULTS.
tar -czf "$OUT/logs.tar.gz" -C /tmp/experiment_logs .
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" --exclude=checkpoints .
# The checkpoints that fit, whole, the furthest trained first (a stack cut off at a part's end
# would come back unreadable).
(cd "$RESULTS" && python3 - <<'PY' | tar -cf - -T -) | split -b 15M -d -a 2 - /tmp/checkpoints.tar.part-
import pathlib, torch
files = []
for path in pathlib.Path(".").glob("*/checkpoints/*.pt"):
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        files.append((saved["step"] / max(1, saved["steps"]), path))
    except Exception:  # unreadable: not worth returning
        pass
room = 45 * 2**20 - 64 * 2**10  # three parts, less the tar headers
for _, path in sorted(files, key=lambda f: -f[0]):
    if path.stat().st_size <= room:
        room -= path.stat().st_size
        print(path)
PY
mv /tmp/checkpoints.tar.part-0[0-2] "$OUT"/ 2>/dev/null
echo "checkpoint parts not returned: $(ls /tmp/checkpoints.tar.part-* 2>/dev/null | wc -l)"
rm -f /tmp/checkpoints.tar.part-*
ls -la "$OUT"
