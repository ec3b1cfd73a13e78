#!/usr/bin/env bash
# The recipe-scaling study (docs/recipe.md, "How the recipe scales"): the shipped recipe against the recipe before
# any scaling and the first recipe, at batch 16, 32 and 64 over 15 epochs, two real-image sets, two seeds; then the
# long schedule (100 epochs) on one set. One thread per run; results appended to bench/out/scaling.csv as each run
# ends (a rerun skips what is done). Mean average precision does not depend on what else runs (one thread,
# deterministic), so the two streams may run side by side; their wall times are then not comparable.
#   bash bench/scaling_pass.sh short & bash bench/scaling_pass.sh long &
#   python bench/fidelity.py --summary --csv bench/out/scaling.csv
set -euo pipefail
cd "$(dirname "$0")/.."
F="python bench/fidelity.py --threads 1 --csv bench/out/scaling.csv --runs bench/out/scaling"
SETS="--datasets paste8-1k paste10n-1k"
case "${1:-short}" in
short)
  # the shipped rule at batch 64, then the recipe before it and the first recipe at each batch
  $F $SETS --seeds 0 1 --epochs 15 --batch-sizes 64 --modes fp32-scale-floor
  $F $SETS --seeds 0 1 --epochs 15 --batch-sizes 16 32 64 --modes fp32-scale-none
  $F $SETS --seeds 0 1 --epochs 15 --batch-sizes 16 32 64 --modes fp32-first ;;
long)
  # 100 epochs: the floor does not bind (1600 steps at batch 64), so the shipped rule is the recipe before it
  $F --datasets paste10n-1k --seeds 0 --epochs 100 --batch-sizes 64 16 --modes fp32-scale-floor ;;
esac
