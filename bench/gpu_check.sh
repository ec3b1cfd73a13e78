#!/usr/bin/env bash
# Training at the GPU's speed, measured in one go on a machine with a GPU (issue 47, augmentation on the device;
# the GPU-throughput issue before it).
#   bash bench/gpu_check.sh [COCO128_YAML] [Y5KIT_FOLDER]
#     COCO128_YAML default ../shared/datasets/coco128/coco128.yaml; Y5KIT_FOLDER: YOLOv5 7.0.14 unpacked from
#     ../shared/bench/y5kit.tgz (default .y5; without it the peer run is skipped with a note)
#   GPU_CHECK_TINY=1 bash bench/gpu_check.sh DATA_YAML   every step on the CPU at toy sizes (yolov5n, 64 px, batch 8,
#     workers 1 and 2, CUDA-only candidates reported as such): bench/tests/test_gpu_check_script.py runs it, so the
#     minutes on a GPU go to measuring, not debugging
#
#   data        bench/loader.py --repeat: COCO128 x 16 under distinct names, 2,048 training images (links)
#   steps       bench/step_candidates.py: yolov5s 640 batch 64: TF32, fp16 with foreach and with fused AdamW, fp16
#               with CUDA graphs; images/s each
#   loop_*      bench/loop_rate.py on the 2,048 images: yolov5s 640 batch 64 fp16, cache ram, 3 epochs (the first
#               left out); --augment-on device and host, 8 and 16 workers
#   loader      bench/loader.py on the 2,048 images at 640, batch 64, 16 workers, both paths: the workers' images/s
#               and the device's seconds per batch
#   decode      bench/loader.py --decode: cv2.imdecode on one core vs torchvision decode_jpeg on the GPU (cache off)
#   compile     bench/step_candidates.py fp16-compile: torch.compile's figure (last of the step candidates: its
#               compilation takes a minute or more)
#   ours,yolov5 10 epochs of train.py and of YOLOv5 7.0.14 on the built-in set: wall time and mAP
#   same_run    a seeded run twice with the CUDA default (augmentation on the device): identical weights?
#   loop_nondet, loop_small   what deterministic algorithms cost; the built-in set's loop (if time is left)
# Each step runs under its own time limit inside one budget (GPU_CHECK_BUDGET_S, default 460 s), in this order, so
# the whole check ends within 8 minutes and the first steps are the ones that matter most. Logs and results go to
# bench/out/gpu_check/<time>/ (or $OUT when set); one table at the end (bench/gpu_goals.py). Exit 2 when no GPU or
# no dataset is there (nothing run).
set -uo pipefail
cd "$(dirname "$0")/.."
COCO=${1:-../shared/datasets/coco128/coco128.yaml}
Y5=${2:-.y5}
PY=${PYTHON:-python}
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-460}))
export PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/mpl AMPYOLO_HOME=${AMPYOLO_HOME:-/tmp/ah}

if [ -n "${GPU_CHECK_TINY:-}" ]; then  # the same steps, on the CPU, at toy sizes
  DEV=cpu; CFG=yolov5n.yaml; IMG=64; BATCH=8; COPIES=2; EPOCHS=2; W1=1; W2=2; AMP=off; LOADER_BATCHES=2
  STEP_ARGS=(--cfg yolov5n.yaml --imgsz 64 --batch 4 --steps 1 --warmup 1 --compile-backend eager)
  SMALL=(--imgsz 64 --epochs 1); PEER_EPOCHS=1; PEER_DATA=$COCO
else
  DEV=0; CFG=yolov5s.yaml; IMG=640; BATCH=64; COPIES=16; EPOCHS=3; W1=8; W2=16; AMP=fp16; LOADER_BATCHES=20
  STEP_ARGS=(--cfg yolov5s.yaml --imgsz 640 --batch 64 --steps 20 --warmup 5)
  SMALL=(); PEER_EPOCHS=10; PEER_DATA=""
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
  case "$NGPU" in ''|*[!0-9]*) NGPU=0 ;; esac
  if [ "$NGPU" -lt 1 ]; then
    echo "gpu_check: no CUDA device here (torch sees none); run it on a machine with a GPU" >&2
    exit 2
  fi
fi
if [ ! -f "$COCO" ]; then
  echo "gpu_check: $COCO not found; pass the COCO128 data YAML as the first argument" >&2
  exit 2
fi
OUTDIR=${OUT:-bench/out/gpu_check/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)  # absolute: YOLOv5 runs from its own package
DATA="$OUTDIR/data/repeat.yaml"

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

loop() {  # loop NAME LIMIT AUGMENT WORKERS [more loop_rate.py arguments]
  local name=$1 limit=$2 aug=$3 workers=$4
  shift 4
  step "$name" "$limit" "$PY" bench/loop_rate.py --data "$DATA" --cfg "$CFG" --imgsz "$IMG" --batch-size "$BATCH" \
    --cache ram --epochs "$EPOCHS" --workers "$workers" --device "$DEV" --amp "$AMP" --augment-on "$aug" \
    --json "$OUTDIR/$name.json" "$@"
}

step data 60 "$PY" bench/loader.py --repeat "$COPIES" --data "$COCO" --out "$OUTDIR/data"
step steps 150 "$PY" bench/step_candidates.py "${STEP_ARGS[@]}" --device "$DEV" \
  --candidates tf32 fp16-foreach fp16 fp16-graphs --json "$OUTDIR/steps.json"
loop loop_device_w$W1 60 device "$W1"
loop loop_host_w$W1 60 host "$W1"
loop loop_device_w$W2 60 device "$W2"
loop loop_host_w$W2 60 host "$W2"
step loader 60 "$PY" bench/loader.py --data "$DATA" --imgsz "$IMG" --workers "$W2" --cache ram --batch-size "$BATCH" \
  --batches "$LOADER_BATCHES" --augment-on host device --device "$DEV"
step decode 30 "$PY" bench/loader.py --decode --data "$COCO" --device "$DEV" --json "$OUTDIR/decode.json"
step compile 150 "$PY" bench/step_candidates.py "${STEP_ARGS[@]}" --device "$DEV" --candidates fp16-compile \
  --json "$OUTDIR/compile.json"
step ours 80 "$PY" train.py ${PEER_DATA:+--data "$PEER_DATA"} "${SMALL[@]}" --device "$DEV" --workers 8 --seed 0 \
  --epochs "$PEER_EPOCHS" --noplots --project "$OUTDIR/runs" --name ours --exist-ok
if [ -z "${GPU_CHECK_TINY:-}" ] && [ -d "$Y5/yolov5" ]; then
  printf 'path: %s/shapes\ntrain: images/train\nval: images/val\nnames: [circle, square, triangle, star, cross]\n' \
    "$AMPYOLO_HOME" > "$OUTDIR/shapes_y5.yaml"
  mkdir -p /tmp/y5cfg; cp "$Y5"/*.ttf /tmp/y5cfg/ 2>/dev/null
  step yolov5 120 env PYTHONPATH="$(pwd)/$Y5" YOLOV5_CONFIG_DIR=/tmp/y5cfg YOLO_OFFLINE=1 WANDB_MODE=disabled \
    COMET_MODE=disabled CLEARML_OFF=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$PY" -m yolov5.train \
    --cfg "$(pwd)/$Y5/yolov5/models/yolov5n.yaml" --weights '' --data "$OUTDIR/shapes_y5.yaml" --epochs 10 --imgsz 192 \
    --batch-size 16 --workers 8 --device 0 --seed 0 --project "$OUTDIR/runs" --name yolov5 --exist-ok
else
  echo "no YOLOv5 kit at $Y5 (tar xzf ../shared/bench/y5kit.tgz), or a tiny check" > "$OUTDIR/yolov5.skipped"
fi
step same_run 60 "$PY" bench/same_run.py --epochs 2 --device "$DEV" ${PEER_DATA:+--data "$PEER_DATA"} "${SMALL[@]}" \
  --json "$OUTDIR/same_run.json"
loop loop_nondet 60 device "$W1" --no-deterministic
step loop_small 50 "$PY" bench/loop_rate.py ${PEER_DATA:+--data "$PEER_DATA"} "${SMALL[@]}" --epochs 3 --workers "$W1" \
  --device "$DEV" --json "$OUTDIR/loop_small.json"
echo "== summary after ${SECONDS}s (logs in $OUTDIR)"
"$PY" bench/gpu_goals.py "$OUTDIR"
