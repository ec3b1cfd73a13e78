#!/usr/bin/env bash
# Training at the GPU's speed, measured in one go on a machine with a GPU (the GPU-throughput issue, goals 1-5).
#   bash bench/gpu_check.sh [COCO128_YAML] [Y5KIT_FOLDER]
#     COCO128_YAML default ../shared/datasets/coco128/coco128.yaml; Y5KIT_FOLDER: YOLOv5 7.0.14 unpacked from
#     ../shared/bench/y5kit.tgz (default .y5; without it goal 5 is skipped with a note)
#
#   1 step      bench/gpu_amp.py: FP32 / fp16 / bf16 steps, yolov5s 640 batch 64, images/s and peak memory
#   2 loop      bench/loop_rate.py: COCO128 at 640, RAM cache, yolov5s batch 64, fp16; and the built-in set,
#               yolov5n 192 batch 16: iterations/s
#   3 loader    bench/loader.py: the mosaic training loader at 640 with 16 workers, images/s
#   4 autobatch train.py --batch-size -1 on the built-in set: its one line
#   5 peers     10 epochs of train.py and of YOLOv5 7.0.14 on the built-in set: wall time and mAP
#   and reproducibility: a seeded run twice (bench/same_run.py), with and without deterministic algorithms, and
#   what they cost: the COCO128 loop again with --no-deterministic
# Each step runs under its own time limit inside one budget (GPU_CHECK_BUDGET_S, default 460 s), so the whole
# check ends within 8 minutes. Logs and results go to bench/out/gpu_check/<time>/ (or $OUT when set); one table
# at the end (bench/gpu_goals.py). Exit 2 when no GPU or no dataset is there (nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
COCO=${1:-../shared/datasets/coco128/coco128.yaml}
Y5=${2:-.y5}
PY=${PYTHON:-python}
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-460}))
export PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/mpl AMPYOLO_HOME=${AMPYOLO_HOME:-/tmp/ah}

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
case "$NGPU" in ''|*[!0-9]*) NGPU=0 ;; esac
if [ "$NGPU" -lt 1 ]; then
  echo "gpu_check: no CUDA device here (torch sees none); run it on a machine with a GPU" >&2
  exit 2
fi
if [ ! -f "$COCO" ]; then
  echo "gpu_check: $COCO not found; pass the COCO128 data YAML as the first argument" >&2
  exit 2
fi
OUTDIR=${OUT:-bench/out/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)  # absolute: YOLOv5 runs from its own package

step() {  # step NAME LIMIT_S COMMAND...: run it under min(LIMIT_S, time left); log and exit code into OUTDIR
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 15))
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  if [ "$limit" -le 0 ]; then
    echo "== $name: no time left in the budget"; echo 124 > "$OUTDIR/$name.rc"; return
  fi
  echo "== $name (at most ${limit}s): $*"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  echo $? > "$OUTDIR/$name.rc"
  echo $((SECONDS - t0)) > "$OUTDIR/$name.seconds"
  tail -n 2 "$OUTDIR/$name.log"
}

step amp 80 "$PY" bench/gpu_amp.py --steps 30 --json "$OUTDIR/amp.json"
step loop_coco 90 "$PY" bench/loop_rate.py --data "$COCO" --cfg yolov5s.yaml --imgsz 640 --batch-size 64 \
  --cache ram --epochs 8 --workers 16 --device 0 --amp fp16 --json "$OUTDIR/loop_coco.json"
step loop_small 60 "$PY" bench/loop_rate.py --epochs 4 --workers 8 --device 0 --json "$OUTDIR/loop_small.json"
step loader 50 "$PY" bench/loader.py --data "$COCO" --imgsz 640 --workers 16 --cache ram --batch-size 64 --batches 20
step autobatch 45 "$PY" train.py --batch-size -1 --epochs 1 --device 0 --noval --noplots --project "$OUTDIR/runs" \
  --name autobatch --exist-ok
# a seeded run twice, with and without deterministic algorithms: identical weights? (the reproducible-runs issue)
step same_run 60 "$PY" bench/same_run.py --epochs 2 --device 0 --json "$OUTDIR/same_run.json"
step same_run_nondet 60 "$PY" bench/same_run.py --epochs 2 --device 0 --no-deterministic \
  --json "$OUTDIR/same_run_nondet.json"
# what deterministic algorithms (train.py's default) cost here: the COCO128 loop again without them
step loop_coco_nondet 80 "$PY" bench/loop_rate.py --data "$COCO" --cfg yolov5s.yaml --imgsz 640 --batch-size 64 \
  --cache ram --epochs 8 --workers 16 --device 0 --amp fp16 --no-deterministic --json "$OUTDIR/loop_coco_nondet.json"
step ours 100 "$PY" train.py --device 0 --workers 8 --seed 0 --epochs 10 --noplots --project "$OUTDIR/runs" --name ours \
  --exist-ok
if [ -d "$Y5/yolov5" ]; then
  printf 'path: %s/shapes\ntrain: images/train\nval: images/val\nnames: [circle, square, triangle, star, cross]\n' \
    "$AMPYOLO_HOME" > "$OUTDIR/shapes_y5.yaml"
  mkdir -p /tmp/y5cfg; cp "$Y5"/*.ttf /tmp/y5cfg/ 2>/dev/null
  step yolov5 150 env PYTHONPATH="$(pwd)/$Y5" YOLOV5_CONFIG_DIR=/tmp/y5cfg YOLO_OFFLINE=1 WANDB_MODE=disabled \
    COMET_MODE=disabled CLEARML_OFF=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$PY" -m yolov5.train \
    --cfg "$(pwd)/$Y5/yolov5/models/yolov5n.yaml" --weights '' --data "$OUTDIR/shapes_y5.yaml" --epochs 10 --imgsz 192 \
    --batch-size 16 --workers 8 --device 0 --seed 0 --project "$OUTDIR/runs" --name yolov5 --exist-ok
else
  echo "no YOLOv5 kit at $Y5 (tar xzf ../shared/bench/y5kit.tgz)" > "$OUTDIR/yolov5.skipped"
fi
echo "== summary after ${SECONDS}s (logs in $OUTDIR)"
"$PY" bench/gpu_goals.py "$OUTDIR"
