#!/usr/bin/env bash
# The CUDA precision path, checked on a real GPU in one go (issue 14): for a session lent a GPU.
#   bash bench/gpu_precision.sh [COCO128_YAML]        (default: ../shared/datasets/coco128/coco128.yaml)
#
#   (a) bench/gpu_amp.py: FP32 / fp16 / bf16 training steps, yolov5s 640 batch 64 channels_last: images/s, peak memory
#   (b) train.py on COCO128, 3 epochs at 640, yolov5s, --amp fp16 and --amp off: epoch time, skipped steps, final mAP
#   (c) test.py on each run's best.pt with --half and --no-half: mAP difference
#   (d) detect.py over the COCO128 images with --half and --no-half at batch 32: images/s, box agreement
#   (e) torchrun with 2 processes when the machine has 2 GPUs, else skipped with a note
#
# Targets: fp16 step >= 2x FP32 images/s with peak memory <= 0.6x; FP16 inference >= 1.5x FP32 at batch 32;
# mAP differences <= 0.005 (bench/gpu_check.py holds them). Each step runs under its own time limit, all
# inside one budget (GPU_CHECK_BUDGET_S, default 450 s), so the whole check ends within 8 minutes; logs and
# exit codes go to bench/out/gpu_check/<time>/. One table at the end (bench/gpu_check.py summary).
# Exit: 0 every check passed, 1 a check failed, 2 no GPU or no dataset (nothing was run).
set -uo pipefail
cd "$(dirname "$0")/.."
COCO=${1:-../shared/datasets/coco128/coco128.yaml}
PY=${PYTHON:-python}
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-450}))
export PYTHONUNBUFFERED=1

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
case "$NGPU" in ''|*[!0-9]*) NGPU=0 ;; esac  # torch missing or broken counts as no GPU
if [ "$NGPU" -lt 1 ]; then
  echo "gpu_check: no CUDA device here (torch sees none); run it on a machine with a GPU" >&2
  exit 2
fi
if [ ! -f "$COCO" ]; then
  echo "gpu_check: $COCO not found; pass the COCO128 data YAML as the first argument" >&2
  exit 2
fi
OUT=bench/out/gpu_check/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"

step() {  # step NAME LIMIT_S COMMAND...: run it under min(LIMIT_S, time left); log and exit code into OUT
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 20))  # 10 s for timeout's kill grace, 10 s for the summary
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  if [ "$limit" -le 0 ]; then
    echo "== $name: no time left in the budget"
    echo 124 > "$OUT/$name.rc"
    return
  fi
  echo "== $name (at most ${limit}s): $*"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo $? > "$OUT/$name.rc"
  tail -n 3 "$OUT/$name.log"
}

TRAIN=(train.py --data "$COCO" --cfg yolov5s.yaml --imgsz 640 --batch-size 16 --epochs 3 --workers 8 --device 0
       --seed 0 --noplots --project "$OUT" --exist-ok)
step amp 90 "$PY" bench/gpu_amp.py --steps 30 --json "$OUT/amp.json"
step train_fp16 110 "$PY" "${TRAIN[@]}" --name fp16 --amp fp16
step train_fp32 110 "$PY" "${TRAIN[@]}" --name fp32 --amp off
step evals 60 "$PY" bench/gpu_check.py evals "$OUT" "$COCO"
step detect 45 "$PY" bench/gpu_check.py detect "$OUT" "$COCO"
if [ "$NGPU" -ge 2 ]; then
  step ddp 70 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 "${TRAIN[@]}" --device 0,1 --epochs 1 \
    --name ddp --amp fp16
else
  echo "the machine has $NGPU GPU; a 2-process run needs 2" > "$OUT/ddp.skipped"
fi
echo "== summary after ${SECONDS}s (logs in $OUT)"
"$PY" bench/gpu_check.py summary "$OUT"
