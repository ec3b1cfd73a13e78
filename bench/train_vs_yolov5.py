"""Training throughput beside YOLOv5 7.0.14: images/s of the training epochs, same data and settings.

    bash ../shared/bench/peers.sh ...          # once: builds the peer venv (/tmp/peer-venv)
    python bench/train_vs_yolov5.py            # COCO128, yolov5n, 320 px, batch 16, 6 epochs, 2 workers

Runs, one after another: YOLOv5's train.py, then ours in FP32 and in bf16 autocast (our defaults,
so the small dataset is cached in RAM: --cache auto), and bf16 once more with --cache off, which reads
and decodes every image from disk each time as YOLOv5's default does; all with mosaic on every epoch. Epoch lengths:
  YOLOv5  its own callbacks 'on_train_epoch_start' / 'on_train_epoch_end' (registered by a small driver
          run in the peer venv) bracket the training part of each epoch; it validates every epoch as
          usual (its --noval crashes in 7.0.14), which these brackets leave out.
  ours    --noval, and the results.csv `time` column: an epoch is training plus the checkpoint writes.
The first epoch (start-up) and, for ours, the last (final validation) are left out; the median of the
rest is reported as images/s = training images / seconds.

    python bench/train_vs_yolov5.py --whole --data D --imgsz 256 --epochs 30

times the two default commands instead, whole: YOLOv5's train.py as ../shared/bench/peers.sh runs it and
our `python train.py` with only the data, size, epochs, batch and workers given (validation every epoch,
each tool's own thread count, every other setting its default), as wall seconds of each process from
start to exit, with the final mAP each one reports. That is the robust-training issue's "wall time".
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.curves import column  # noqa: E402
from bench.detect_vs_yolov5 import PEER_PY, peer_env  # noqa: E402
from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.data.labels import list_image_files  # noqa: E402
from utils.files import REPO_ROOT  # noqa: E402
from utils.report.results import read_records  # noqa: E402

COCO128_YAML = SHARED_COCO128 / "coco128.yaml"


# runs in the peer venv: YOLOv5's train.main with two timing callbacks; argv[1] = where the marks go
YOLOV5_DRIVER = """
import json, sys, time
from yolov5 import train
from yolov5.utils.callbacks import Callbacks
out = sys.argv[1]
sys.argv = sys.argv[:1] + sys.argv[2:]
marks, cb = [], Callbacks()
cb.register_action("on_train_epoch_start", callback=lambda *a, **k: marks.append(["start", time.perf_counter()]))
cb.register_action("on_train_epoch_end", callback=lambda *a, **k: marks.append(["end", time.perf_counter()]))
train.main(train.parse_opt(), callbacks=cb)
json.dump(marks, open(out, "w"))
"""


def median_epoch(ends: list[float]) -> float:
    """Median length of the epochs between the first and the last."""
    lengths = [b - a for a, b in zip(ends, ends[1:])][:-1]  # epoch k's length = end(k) - end(k-1), k = 1..n-2
    return statistics.median(lengths)


def peer_data_yaml(data: Path, out: Path) -> Path:
    """A copy of the data YAML with `path` made absolute (the peers resolve it against their working folder)."""
    import yaml

    d = yaml.safe_load(data.read_text())
    d["path"] = str((data.parent / (d.get("path") or ".")).resolve())
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


def yolov5_args(a: argparse.Namespace, tmp: Path) -> list[str]:
    """YOLOv5 train.py's arguments for these settings, as ../shared/bench/peers.sh gives them."""
    cfg = subprocess.run([str(PEER_PY), "-c", "import yolov5,os;print(os.path.dirname(yolov5.__file__))"],
                         capture_output=True, text=True, check=True, env=peer_env()).stdout.split()[-1]
    data = peer_data_yaml(a.data, tmp / "data.yaml")
    return ["--weights", "", "--cfg", f"{cfg}/models/yolov5n.yaml", "--data", str(data), "--epochs", str(a.epochs),
            "--batch-size", str(a.batch), "--imgsz", str(a.imgsz), "--device", "cpu", "--workers", str(a.workers),
            "--seed", "0", "--noplots", "--project", str(tmp / "yolov5"), "--name", "run"]


def run_yolov5(a: argparse.Namespace, tmp: Path) -> float:
    marks_file = tmp / "yolov5_marks.json"
    cmd = [str(PEER_PY), "-c", YOLOV5_DRIVER, str(marks_file), *yolov5_args(a, tmp)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=peer_env(), cwd=tmp)
    if p.returncode:
        sys.exit(f"YOLOv5 training failed:\n{p.stderr[-2000:]}")
    marks = json.loads(marks_file.read_text())
    starts = [t for kind, t in marks if kind == "start"]
    ends = [t for kind, t in marks if kind == "end"]
    return statistics.median([e - s for s, e in zip(starts, ends)][1:])  # epoch 0 pays for start-up


def ours_cmd(data: Path, a: argparse.Namespace, tmp: Path, name: str) -> list[str]:
    """Our train.py command for these settings, writing to tmp/ours/<name>."""
    return [sys.executable, str(REPO_ROOT / "train.py"), "--data", str(data), "--epochs", str(a.epochs),
            "--batch-size", str(a.batch), "--imgsz", str(a.imgsz), "--workers", str(a.workers),
            "--project", str(tmp / "ours"), "--name", name]


def run_ours(data: Path, a: argparse.Namespace, tmp: Path, amp: str, cache: str) -> float:
    cmd = [*ours_cmd(data, a, tmp, f"{amp}_{cache}"), "--amp", amp, "--close-mosaic", "0", "--cache", cache,
           "--noval", "--noplots"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"our training ({amp}) failed:\n{p.stderr[-2000:]}")
    return median_epoch(list(column(read_records(tmp / "ours" / f"{amp}_{cache}" / "results.csv"), "time")))


def whole_runs(a: argparse.Namespace, tmp: Path) -> dict[str, tuple[float, float, float]]:
    """label -> (process wall s, final mAP@0.5, final mAP@0.5:0.95) of each tool's default command."""
    ours = ours_cmd(a.data.resolve(), a, tmp, "run")
    yolov5 = [str(PEER_PY), "-m", "yolov5.train", *yolov5_args(a, tmp)]
    runs = {"ours (default command)": (ours, None, tmp / "ours" / "run" / "results.csv"),
            "YOLOv5 7.0.14": (yolov5, peer_env(), tmp / "yolov5" / "run" / "results.csv")}
    out = {}
    for label, (cmd, env, results) in runs.items():
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        wall = time.perf_counter() - t0
        if p.returncode:
            sys.exit(f"{label} training failed:\n{p.stderr[-2000:]}")
        rows = read_records(results)
        out[label] = (wall, float(column(rows, "mAP_0.5", without=":")[-1]), float(column(rows, "mAP_0.5:0.95")[-1]))
        print(f"{label}: {wall:.1f} s, final mAP@0.5 {out[label][1]:.3f}, mAP@0.5:0.95 {out[label][2]:.3f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=COCO128_YAML)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--whole", action="store_true", help="time the two default commands whole (validation included)")
    a = ap.parse_args()
    if not PEER_PY.exists():
        sys.exit(f"{PEER_PY} not found: run ../shared/bench/peers.sh once to build the peer venv")
    if a.epochs < 3:
        sys.exit("--epochs must be 3 or more (the first and last epochs are left out)")
    n = len(list_image_files(load_data_config(a.data)["train"]))
    if a.whole:
        with tempfile.TemporaryDirectory() as d:
            runs = whole_runs(a, Path(d))
        print(f"\n{a.data.name}: {n} training images, yolov5n, {a.imgsz} px, batch {a.batch}, {a.workers} workers, "
              f"{a.epochs} epochs, each tool's default command (validation every epoch, its own threads), seed 0")
        print(f"{'':24} {'wall s':>8} {'vs YOLOv5':>10} {'mAP@0.5':>8} {'mAP@0.5:0.95':>13}")
        y5 = runs["YOLOv5 7.0.14"][0]
        for label, (wall, m50, m) in runs.items():
            print(f"{label:24} {wall:8.1f} {wall / y5:9.2f}x {m50:8.3f} {m:13.3f}")
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        secs = {"YOLOv5 7.0.14": run_yolov5(a, tmp)}
        for amp, cache, label in (("off", "auto", "ours, FP32"), ("bf16", "auto", "ours, bf16 autocast"),
                                  ("bf16", "off", "ours, bf16, --cache off")):
            secs[label] = run_ours(a.data, a, tmp, amp, cache)
    y5 = n / secs["YOLOv5 7.0.14"]
    print(f"\n{a.data.name}: {n} training images, yolov5n, {a.imgsz} px, batch {a.batch}, {a.workers} workers, "
          f"mosaic on, median epoch of {a.epochs} (the first left out, and our last: final validation)")
    print(f"{'':22} {'s/epoch':>8} {'images/s':>9} {'vs YOLOv5':>10}")
    for label, s in secs.items():
        print(f"{label:22} {s:8.2f} {n / s:9.1f} {n / s / y5:9.2f}x")


if __name__ == "__main__":
    main()
