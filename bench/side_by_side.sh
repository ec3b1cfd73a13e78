#!/usr/bin/env bash
# Issue 7's side-by-side run: ours beside YOLOv5 7.0.14 and Ultralytics 8.4.190 on the same data and
# settings, one after another on a quiet machine. Logs, run folders and plots go to bench/out/side_by_side/.
#   bash bench/side_by_side.sh [COCO128_YAML] [PARTS]
# PARTS (default "coco128 shapes throughput detect"):
#   coco128     time to accuracy, COCO128 at 320, batch 16, 30 epochs (env COCO_EPOCHS) from scratch
#   shapes      time to accuracy, the built-in dataset with its suggested settings (192 px, 40 epochs)
#   throughput  training images/s beside YOLOv5 (bench/train_vs_yolov5.py)
#   detect      detect.py beside YOLOv5's detect.py, same weights (bench/detect_vs_yolov5.py)
set -uo pipefail
cd "$(dirname "$0")/.."
COCO=$(realpath "${1:-../shared/datasets/coco128/coco128.yaml}")
PARTS=${2:-coco128 shapes throughput detect}
PEERS=$(realpath ../shared/bench/peers.sh)
OUT=bench/out/side_by_side; mkdir -p $OUT
log() { echo "== $(date +%H:%M:%S) $*" | tee -a $OUT/all.log; }

time_to_accuracy() {  # name peer_data_yaml epochs imgsz [our_data_yaml]; ours: default recipe and precision
  local name=$1 data=$2 epochs=$3 imgsz=$4 ours_data=${5:-$2}
  log "$name: peers.sh $data $epochs $imgsz 16"
  # peers.sh reuses one run folder per peer, and YOLOv5 appends to a results.csv it finds there
  rm -rf /tmp/peer-runs/yolov5/run /tmp/peer-runs/ultralytics/run
  bash "$PEERS" "$data" "$epochs" "$imgsz" 16 2>&1 | tee -a $OUT/all.log
  name=$name$([ "$name" = coco128 ] && [ "$epochs" != 30 ] && echo "_$epochs")
  rm -rf "$OUT/$name" && mkdir -p "$OUT/$name" && cp -r /tmp/peer-runs/yolov5 /tmp/peer-runs/ultralytics "$OUT/$name/"
  log "$name: ours"
  python train.py --data "$ours_data" --epochs "$epochs" --imgsz "$imgsz" --batch-size 16 --workers 2 --noplots \
    --project "$OUT/$name" --name ours > "$OUT/$name/ours.log" 2>&1
  grep -E "precision:|optimizer:|done:" "$OUT/$name/ours.log" | tee -a $OUT/all.log
  python bench/curves.py --ours "$OUT/$name/ours/results.csv" --yolov5 "$OUT/$name/yolov5/run" \
    --ultralytics "$OUT/$name/ultralytics/run" --title "$name: yolov5n, ${imgsz} px, batch 16, $epochs epochs" \
    --out "$OUT/$name/curves.png" 2>&1 | tee -a $OUT/all.log
}

for part in $PARTS; do
  case $part in
    coco128) time_to_accuracy coco128 "$COCO" "${COCO_EPOCHS:-30}" 320 ;;
    shapes)
      # the built-in dataset as a plain YAML the peers can read (generated first if missing)
      root=$(python -c "from utils.data.synthetic import ensure_shapes_dataset; print(ensure_shapes_dataset())")
      printf 'path: %s\ntrain: images/train\nval: images/val\nnames: [circle, square, triangle, star, cross]\n' \
        "$root" > $OUT/shapes_peers.yaml
      time_to_accuracy shapes "$(realpath $OUT/shapes_peers.yaml)" 40 192 data/shapes.yaml ;;
    throughput) log "throughput"; python bench/train_vs_yolov5.py --data "$COCO" 2>&1 | tee -a $OUT/all.log ;;
    detect) log "detect"; python bench/detect_vs_yolov5.py 2>&1 | tail -8 | tee -a $OUT/all.log ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
log "done"
