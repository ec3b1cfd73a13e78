#!/usr/bin/env bash
# Every benchmark of the project, one after another, on a quiet machine; output to bench/out/ (ignored by git).
#   bash bench/run_all.sh [COCO128_YAML]
# Figures are quoted as ratios within one run (these machines are noisy); BENCHMARKS.md records them.
set -uo pipefail
cd "$(dirname "$0")/.."
COCO=${1:-../shared/datasets/coco128/coco128.yaml}
OUT=bench/out; mkdir -p $OUT
run() { local name=$1; shift; echo "== $name: $*" | tee -a $OUT/all.log; ( time "$@" ) >> $OUT/$name.log 2>&1; tail -25 $OUT/$name.log >> $OUT/all.log; }
run train_step python bench/train_step.py --imgsz 320 640 --steps 4
run loader     python bench/loader.py --data "$COCO"
run metrics    python bench/metrics_speed.py
run detect     python bench/detect_speed.py
