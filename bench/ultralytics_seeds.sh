#!/bin/bash
# Ultralytics 8.4.190 on one dataset at several seeds, so the "x Ultralytics" figures divide by a mean
# over seeds rather than by ../shared/bench/peers.sh's one seed-0 run. Same settings as peers.sh
# (yolov5n from scratch, workers 2, amp off, offline); its venv must exist (run peers.sh once).
#   bash bench/ultralytics_seeds.sh DATA_YAML EPOCHS IMGSZ BATCH SEED [SEED ...]
# Prints one line per seed: final mAP@0.5 and mAP@0.5:0.95 from the run's results.csv, and its wall time.
set -uo pipefail
DATA=$(realpath "$1"); EPOCHS=$2; IMGSZ=$3; BATCH=$4; shift 4
V=/tmp/peer-venv; R=/tmp/peer-runs
[ -x $V/bin/yolo ] || { echo "no peer venv at $V: run bash ../shared/bench/peers.sh $1 once to build it"; exit 1; }
export YOLO_CONFIG_DIR=$R/cfg/ul YOLO_OFFLINE=1 HF_HUB_OFFLINE=1 YOLO_AUTOINSTALL=False WANDB_MODE=disabled \
  COMET_MODE=disabled CLEARML_OFF=1 CUDA_VISIBLE_DEVICES="" MPLCONFIGDIR=$R/cfg/mpl
mkdir -p $R
$V/bin/python - "$DATA" $R/seeds-data.yaml <<'PY'
import sys, os, yaml
d = yaml.safe_load(open(sys.argv[1]))
d['path'] = os.path.normpath(os.path.join(os.path.dirname(sys.argv[1]), d.get('path') or '.'))
yaml.safe_dump(d, open(sys.argv[2], 'w'), sort_keys=False)
PY
for SEED in "$@"; do
  t0=$(date +%s)
  $V/bin/yolo detect train model=yolov5n.yaml data=$R/seeds-data.yaml epochs=$EPOCHS imgsz=$IMGSZ batch=$BATCH \
    workers=2 seed=$SEED device=cpu pretrained=False plots=False amp=False project=$R/ul-seeds name=s$SEED \
    exist_ok=True > $R/ul-seeds-s$SEED.log 2>&1
  $V/bin/python - $R/ul-seeds/s$SEED/results.csv $SEED $(( $(date +%s) - t0 )) <<'PY'
import csv, sys
path, seed, wall = sys.argv[1:]
try:
    last = {k.strip(): v.strip() for k, v in list(csv.DictReader(open(path)))[-1].items()}
except (OSError, IndexError):
    sys.exit(f"seed {seed}: no results ({path}; see its log beside it)")
print(f"ultralytics seed {seed}: final mAP@0.5 {float(last['metrics/mAP50(B)']):.3f}, "
      f"mAP@0.5:0.95 {float(last['metrics/mAP50-95(B)']):.3f}, {wall} s", flush=True)
PY
done
