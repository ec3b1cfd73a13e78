"""Time to accuracy: mAP@0.5:0.95 (and mAP@0.5) against wall seconds for ours, YOLOv5 and Ultralytics, in one plot.

    python bench/curves.py --ours runs/train/exp/results.csv --yolov5 /tmp/peer-runs/yolov5/run \
        --ultralytics /tmp/peer-runs/ultralytics/run --title "built-in dataset, 40 epochs, 192 px" --out curves.png

The clocks, each from the tool's own records:
  ours         results.csv `time`: seconds spent in epochs (training + validation), summed over resumes
  Ultralytics  results.csv `time`: seconds since its training loop started
  YOLOv5       no time column; its TensorBoard event file stamps each epoch's scalars with the wall time.
               Epoch k ends at stamp(k) - stamp(0) + d, where d (the first epoch's length, which has no
               earlier stamp) is taken as the mean epoch length. The event file is read here directly
               (TFRecord framing, then the Event message's wall_time and step fields): no TensorBoard needed.
Prints the final mAPs and the seconds each tool needed to first reach a given fraction of the best final mAP.
"""
from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.report.results import read_records  # noqa: E402


def column(rows: list[dict[str, str]], *needles: str, without: str = "") -> np.ndarray:
    key = next(k for k in rows[0] if all(n in k for n in needles) and not (without and without in k))
    return np.array([float(r[key]) for r in rows])


def ours_curve(results: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = read_records(results)
    return column(rows, "time"), column(rows, "mAP_0.5", without=":"), column(rows, "mAP_0.5:0.95")


def ultralytics_curve(run: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = read_records(run / "results.csv")
    return column(rows, "time"), column(rows, "mAP50(B)"), column(rows, "mAP50-95")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def event_stamps(path: Path) -> dict[int, float]:
    """step -> latest wall_time among the records of a TensorBoard event file."""
    data, i, stamps = path.read_bytes(), 0, {}
    while i + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        rec, i = data[i + 12 : i + 12 + n], i + 12 + n + 4  # length, its crc, the record, its crc
        j, wall, step = 0, None, 0
        while j < len(rec):
            key, j = _varint(rec, j)
            field, wire = key >> 3, key & 7
            if wire == 1:  # 64-bit
                if field == 1:
                    (wall,) = struct.unpack_from("<d", rec, j)
                j += 8
            elif wire == 0:
                v, j = _varint(rec, j)
                if field == 2:
                    step = v
            elif wire == 2:
                ln, j = _varint(rec, j)
                j += ln
            elif wire == 5:
                j += 4
            else:
                break
        if wall is not None and step >= 0:
            stamps[step] = max(stamps.get(step, 0.0), wall)
    return stamps


def yolov5_curve(run: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = read_records(run / "results.csv")
    events = sorted(run.glob("events.out.tfevents.*"))
    if not events:
        raise SystemExit(f"{run}: no TensorBoard event file, so no per-epoch clock for YOLOv5")
    stamps = event_stamps(events[-1])
    ends = np.array([stamps[k] for k in range(len(rows))])
    d = (ends[-1] - ends[0]) / max(len(ends) - 1, 1)
    return ends - ends[0] + d, column(rows, "mAP_0.5", without=":"), column(rows, "mAP_0.5:0.95")


def first_reaching(t: np.ndarray, m: np.ndarray, level: float) -> float:
    hit = np.nonzero(m >= level)[0]
    return float(t[hit[0]]) if len(hit) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", type=Path, required=True, help="our results.csv")
    ap.add_argument("--yolov5", type=Path, help="YOLOv5 run folder (results.csv + event file)")
    ap.add_argument("--ultralytics", type=Path, help="Ultralytics run folder (results.csv)")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", type=Path, default=Path("curves.png"))
    args = ap.parse_args()
    curves = {"ours": ours_curve(args.ours)}
    if args.yolov5:
        curves["YOLOv5 7.0.14"] = yolov5_curve(args.yolov5)
    if args.ultralytics:
        curves["Ultralytics 8.4.190"] = ultralytics_curve(args.ultralytics)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), tight_layout=True)
    for name, (t, m50, m) in curves.items():
        axes[0].plot(t, m, marker=".", label=name)
        axes[1].plot(t, m50, marker=".", label=name)
    for ax, label in zip(axes, ("mAP@0.5:0.95", "mAP@0.5")):
        ax.set_xlabel("wall seconds")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    if args.title:
        fig.suptitle(args.title)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    best = max(float(m[-1]) for _, _, m in curves.values())
    print(f"{'':20} {'epochs':>6} {'wall s':>8} {'mAP@0.5':>9} {'mAP@.5:.95':>10} {'s to 90% of best final':>23}")
    for name, (t, m50, m) in curves.items():
        print(f"{name:20} {len(t):6d} {t[-1]:8.1f} {m50[-1]:9.5f} {m[-1]:10.5f} {first_reaching(t, m, 0.9 * best):23.1f}")
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
