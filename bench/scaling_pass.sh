#!/usr/bin/env bash
# The recipe-scaling study (docs/recipe.md, "How the recipe scales"): the recipe across batch sizes and schedule
# lengths on two real-image sets, one run at a time (one thread each, so other work on the machine cannot stall
# them), results appended to bench/out/scaling.csv as each run ends (a rerun skips what is done). About 4 hours on
# 2 cores; the passes are in order of what they decide.
#   bash bench/scaling_pass.sh            then: python bench/fidelity.py --summary --csv bench/out/scaling.csv
set -euo pipefail
cd "$(dirname "$0")/.."
F="python bench/fidelity.py --threads 1 --csv bench/out/scaling.csv --runs bench/out/scaling"
SETS="--datasets paste8-1k paste10n-1k"
# 1. 15 epochs, seed 0: the shipped rule (warmup cap + sqrt lr), the recipe before it, the first recipe; then the
#    linear lr rule and the warmup cap alone
$F $SETS --seeds 0 --epochs 15 --batch-sizes 16 32 64 --modes fp32-scale-sqrt fp32-scale-none fp32-first
$F $SETS --seeds 0 --epochs 15 --batch-sizes 32 64 --modes fp32-scale-lin
$F $SETS --seeds 0 --epochs 15 --batch-sizes 64 --modes fp32-scale-cap
# 2. the long schedule and the large batch, one set (at batch 16 over 100 epochs the two recipes are the same)
$F --datasets paste10n-1k --seeds 0 --epochs 100 --batch-sizes 16 64 256 --modes fp32-scale-sqrt
$F --datasets paste10n-1k --seeds 0 --epochs 100 --batch-sizes 64 256 --modes fp32-scale-none
# 3. a second seed of the 15-epoch comparison
$F $SETS --seeds 1 --epochs 15 --batch-sizes 16 32 64 --modes fp32-scale-sqrt fp32-scale-none fp32-first
