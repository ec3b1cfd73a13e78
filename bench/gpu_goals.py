"""The judging half of bench/gpu_check.sh: one table of the GPU-throughput issue's goals from what its steps left.

    python bench/gpu_goals.py OUT        # OUT: the folder bench/gpu_check.sh wrote

`read_out` turns OUT's files into plain numbers (absent ones stay absent), `goals` turns those into rows with a
target each; it is a pure function, so bench/tests/test_gpu_goals.py tries it on made-up numbers.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from utils.report.results import read_records  # noqa: E402

MIN_STEP_SPEEDUP = 2.0  # fp16 training images/s over FP32/TF32's, yolov5s 640 batch 64
MIN_STEP_RATE = 2000.0  # fp16 images/s
MAX_STEP_MEMORY = 0.55  # fp16 peak memory over FP32's
MIN_LOOP_SHARE = 0.85  # real-data training images/s over the fp16 step's
MIN_SMALL_IT_S = 40.0  # yolov5n 192 batch 16, the built-in set
MIN_LOADER_RATE = 2000.0  # images/s at 640 with mosaic
MIN_PEER_SPEEDUP = 2.0  # YOLOv5's wall time over ours, same data and epochs


def _json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _final_map(csv: Path) -> float | None:
    try:
        rows = read_records(csv)
        return float(rows[-1]["metrics/mAP_0.5:0.95"]) if rows else None
    except (OSError, KeyError, ValueError):
        return None


def _seconds(out: Path, name: str) -> float | None:
    try:
        return float((out / f"{name}.seconds").read_text())
    except (OSError, ValueError):
        return None


def read_out(out: Path) -> dict:
    r: dict = {}
    amp = _json(out / "amp.json")
    if isinstance(amp, list):
        r["step"] = {row["mode"]: row for row in amp}
    for name in ("loop_coco", "loop_small", "loop_coco_nondet", "same_run", "same_run_nondet"):
        if isinstance(data := _json(out / f"{name}.json"), dict):
            r[name] = data
    try:
        rates = re.findall(r"^\s*640\s+\S+\s+\d+\s+([\d.]+)\s*$", (out / "loader.log").read_text(), re.M)
        if rates:
            r["loader"] = float(rates[-1])
    except OSError:
        pass
    try:
        line = next((ln for ln in (out / "autobatch.log").read_text().splitlines() if "AutoBatch" in ln), None)
        if line:
            r["autobatch"] = line.strip()
    except OSError:
        pass
    for name in ("ours", "yolov5"):
        folder = out / "runs" / name
        m = _final_map(folder / "results.csv")
        if m is not None:
            r[name] = {"map": m, "seconds": _seconds(out, name)}
    return r


def goals(r: dict) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met) rows; met None where the figure is missing."""
    rows = []
    step = r.get("step", {})
    fp32, fp16 = step.get("off"), step.get("fp16")
    if fp32 and fp16:
        speed, mem = fp16["img/s"] / fp32["img/s"], fp16["peak GiB"] / fp32["peak GiB"]
        rows += [("1 step: fp16 over FP32", f"{speed:.2f}x ({fp16['img/s']:.0f} vs {fp32['img/s']:.0f} img/s)",
                  f">= {MIN_STEP_SPEEDUP}x", speed >= MIN_STEP_SPEEDUP),
                 ("1 step: fp16 images/s", f"{fp16['img/s']:.0f}", f">= {MIN_STEP_RATE:.0f}", fp16["img/s"] >= MIN_STEP_RATE),
                 ("1 step: fp16 peak memory", f"{mem:.2f}x FP32's", f"<= {MAX_STEP_MEMORY}x",
                  mem <= MAX_STEP_MEMORY)]
    else:
        rows.append(("1 step", "missing", "", None))
    loop = r.get("loop_coco")
    if loop and fp16:
        share = loop["img/s"] / fp16["img/s"]
        rows.append(("2 loop: COCO128 640 over the step", f"{share:.2f} ({loop['img/s']:.0f} img/s)",
                     f">= {MIN_LOOP_SHARE}", share >= MIN_LOOP_SHARE))
    else:
        rows.append(("2 loop: COCO128 640", "missing", "", None))
    nondet = r.get("loop_coco_nondet")
    if loop and nondet:
        rows.append(("deterministic algorithms (default) cost", f"{loop['img/s'] / nondet['img/s']:.2f}x the images/s "
                     f"without ({nondet['img/s']:.0f} img/s)", "information", None))
    for name, what in (("same_run", "deterministic"), ("same_run_nondet", "--no-deterministic")):
        if same := r.get(name):
            rows.append((f"seeded run twice, {what}", f"weights identical: {same['identical_weights']} (max diff "
                         f"{same['max_weight_diff']:.3g})", "identical with deterministic",
                         same["identical_weights"] if name == "same_run" else None))
    small = r.get("loop_small")
    rows.append(("2 loop: yolov5n 192 batch 16", f"{small['it/s']:.1f} it/s" if small else "missing",
                 f">= {MIN_SMALL_IT_S:.0f} it/s", small["it/s"] >= MIN_SMALL_IT_S if small else None))
    loader = r.get("loader")
    rows.append(("3 loader: 640 mosaic, 16 workers", f"{loader:.0f} img/s" if loader else "missing",
                 f">= {MIN_LOADER_RATE:.0f}", loader >= MIN_LOADER_RATE if loader else None))
    rows.append(("4 autobatch", r.get("autobatch", "missing"), "capped by the data, says so", None))
    ours, y5 = r.get("ours"), r.get("yolov5")
    if ours and y5 and ours.get("seconds") and y5.get("seconds"):
        speed = y5["seconds"] / ours["seconds"]
        rows += [("5 peers: YOLOv5's time over ours", f"{speed:.2f}x ({y5['seconds']:.0f} s vs {ours['seconds']:.0f} s)",
                  f">= {MIN_PEER_SPEEDUP}x", speed >= MIN_PEER_SPEEDUP),
                 ("5 peers: mAP@0.5:0.95 ours vs YOLOv5", f"{ours['map']:.3f} vs {y5['map']:.3f}", ">= YOLOv5's",
                  ours["map"] >= y5["map"])]
    else:
        rows.append(("5 peers", "missing", "", None))
    return rows


def table(rows: list[tuple[str, str, str, bool | None]]) -> str:
    verdict = {True: "met", False: "MISSED", None: "-"}
    lines = ["| goal | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {g} | {m} | {t} | {verdict[ok]} |" for g, m, t, ok in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python bench/gpu_goals.py OUT")
    print(table(goals(read_out(Path(argv[0])))))


if __name__ == "__main__":
    main()
