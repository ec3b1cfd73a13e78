#!/usr/bin/env bash
# The recipe-scaling study (docs/recipe.md, "How the recipe scales"): the recipe across batch sizes and schedule
# lengths on two real-image sets, one run at a time (one thread each, so other work on the machine cannot stall
# them), results appended to bench/out/scaling.csv as each run ends (a rerun skips what is done). Several hours
# on 2 cores; the passes are in order of what they decide.
#   bash bench/scaling_pass.sh            then: python bench/fidelity.py --summary --csv bench/out/scaling.csv
set -euo pipefail
cd "$(dirname "$0")/.."
F="python bench/fidelity.py --threads 1 --csv bench/out/scaling.csv --runs bench/out/scaling"
SETS="--datasets paste8-1k paste10n-1k"
# 1. batch 64, 15 epochs, seed 0: the recipe before (none), each candidate change, the first recipe
$F $SETS --seeds 0 --epochs 15 --batch-sizes 64 --modes fp32-scale-none fp32-scale-ema fp32-scale-lin fp32-scale-lin-ema \
  fp32-scale-sqrt-ema fp32-scale-sde fp32-scale-steps fp32-scale-sqrt fp32-first
# 2. batch 16 and 32 of the same
$F $SETS --seeds 0 --epochs 15 --batch-sizes 16 32 --modes fp32-scale-none fp32-first
$F $SETS --seeds 0 --epochs 15 --batch-sizes 32 --modes fp32-scale-steps fp32-scale-sde fp32-scale-lin-ema fp32-scale-sqrt-ema
# 3. a second seed
$F $SETS --seeds 1 --epochs 15 --batch-sizes 64 32 16 --modes fp32-scale-sde fp32-scale-none fp32-first
# 4. the long schedule and the large batch, one set (at batch 16 over 100 epochs the recipes are the same)
$F --datasets paste10n-1k --seeds 0 --epochs 100 --batch-sizes 64 256 16 --modes fp32-scale-sde
$F --datasets paste10n-1k --seeds 0 --epochs 100 --batch-sizes 64 256 --modes fp32-scale-none
