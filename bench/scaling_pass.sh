#!/usr/bin/env bash
# The recipe-scaling study (docs/recipe.md, "How the recipe scales"): the recipe across batch sizes and schedule lengths on
# two real-image sets, one run at a time, results appended to bench/out/scaling.csv as each run ends (a rerun
# skips what is done). About 3 hours on 2 cores; the passes are in order of what they decide.
#   bash bench/scaling_pass.sh            then: python bench/fidelity.py --summary --csv bench/out/scaling.csv
set -euo pipefail
cd "$(dirname "$0")/.."
F="python bench/fidelity.py --csv bench/out/scaling.csv --runs bench/out/scaling --datasets paste8-1k paste10n-1k"
# 1. 15 epochs, seed 0: the shipped rule (cap + sqrt lr), the recipe before it, the first recipe; then one-change modes
$F --seeds 0 --epochs 15 --batch-sizes 16 32 64 --modes fp32-scale-sqrt fp32-scale-none fp32-first
$F --seeds 0 --epochs 15 --batch-sizes 32 64 --modes fp32-scale-lin
$F --seeds 0 --epochs 15 --batch-sizes 64 --modes fp32-scale-cap
# 2. a second seed of the three
$F --seeds 1 --epochs 15 --batch-sizes 16 32 64 --modes fp32-scale-sqrt fp32-scale-none fp32-first
# 3. the long schedule and the large batch, one set
python bench/fidelity.py --csv bench/out/scaling.csv --runs bench/out/scaling --datasets paste10n-1k --seeds 0 \
    --epochs 100 --batch-sizes 16 64 256 --modes fp32-scale-sqrt fp32-scale-none
