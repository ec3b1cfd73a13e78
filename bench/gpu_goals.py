"""The judging half of bench/gpu_check.sh: one table of the GPU goals (issue 47, and the GPU-throughput issue's
before it) from what its steps left.

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

MIN_STEP_SPEEDUP = 2.0  # fp16 training images/s over TF32's, yolov5s 640 batch 64 (train.py's step, or a candidate)
MIN_STEP_RATE = 2000.0  # fp16 images/s
MIN_LOOP_SHARE = 0.85  # the training loop's images/s over the fp16 step's: 2,048+ images, 8 workers
MIN_LOOP_IMAGES = 2048
MIN_SMALL_IT_S = 40.0  # yolov5n 192 batch 16, the built-in set
MIN_LOADER_RATE = 2000.0  # the workers' images/s at 640 with mosaic, device path, 16 workers
MIN_PEER_SPEEDUP = 2.0  # YOLOv5's wall time over ours, same data and epochs
LOOP = re.compile(r"loop_(device|host)_w(\d+)\.json$")
LOADER_ROW = re.compile(r"^\s*(\d+)\s+\S+\s+(\d+)\s+(host|device)\s+([\d.]+)\s+(\S+)\s*$", re.M)


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
    r: dict = {"steps": {}, "loops": {}, "loader": {}}
    for name in ("steps", "compile"):
        rows = _json(out / f"{name}.json")
        for row in rows if isinstance(rows, list) else []:
            r["steps"][row["candidate"]] = row
    for f in sorted(out.glob("loop_*_w*.json")) if out.is_dir() else []:
        if (m := LOOP.search(f.name)) and isinstance(data := _json(f), dict):
            r["loops"][(m[1], int(m[2]))] = data
    for name in ("loop_small", "loop_nondet", "same_run", "decode"):
        if isinstance(data := _json(out / f"{name}.json"), dict):
            r[name] = data
    try:
        rows = LOADER_ROW.findall((out / "loader.log").read_text())
        size = max(int(s) for s, *_ in rows) if rows else 0
        for s, workers, path, rate, dev_s in rows:
            if int(s) == size:
                r["loader"][path] = {"img/s": float(rate), "workers": int(workers),
                                     "device_s": None if dev_s == "-" else float(dev_s)}
    except OSError:
        pass
    for name in ("ours", "yolov5"):
        m = _final_map(out / "runs" / name / "results.csv")
        if m is not None:
            r[name] = {"map": m, "seconds": _seconds(out, name)}
    return r


Row = tuple[str, str, str, "bool | None"]


def _step_rows(steps: dict) -> list[Row]:
    tf32, fp16 = steps.get("tf32", {}).get("img/s"), steps.get("fp16", {}).get("img/s")
    rows: list[Row] = []
    if tf32 and fp16:
        rows.append(("1 step: fp16 (train.py's) over TF32", f"{fp16 / tf32:.2f}x ({fp16:.0f} vs {tf32:.0f} img/s)",
                     f">= {MIN_STEP_SPEEDUP}x", fp16 / tf32 >= MIN_STEP_SPEEDUP))
    else:
        rows.append(("1 step: fp16 over TF32", "missing", "", None))
    if fp16:
        rows.append(("1 step: fp16 images/s", f"{fp16:.0f}", f">= {MIN_STEP_RATE:.0f}", fp16 >= MIN_STEP_RATE))
    for name, row in steps.items():
        if name in ("tf32", "fp16"):
            continue
        if "img/s" in row:
            note = f", compiled in {row['compile s']:.0f} s" if "compile s" in row else ""
            text = f"{row['img/s']:.0f} img/s" + (f", {row['img/s'] / fp16:.2f}x fp16" if fp16 else "") + note
        else:
            text = row.get("skipped") or row.get("error", "no figure")
        rows.append((f"1 step candidate: {name}", text, "information", None))
    best = max((row["img/s"] for name, row in steps.items() if name.startswith("fp16") and "img/s" in row), default=0)
    if tf32 and best:
        name = next(n for n, row in steps.items() if row.get("img/s") == best)
        rows.append(("1 step: best fp16 candidate over TF32", f"{best / tf32:.2f}x ({name})", f">= {MIN_STEP_SPEEDUP}x",
                     best / tf32 >= MIN_STEP_SPEEDUP))
    return rows


def _loop_rows(loops: dict, fp16: float | None) -> list[Row]:
    if not loops:
        return [("2 loop: 2,048 images", "missing", "", None)]
    rows: list[Row] = []
    few = min(w for _, w in loops)
    for (path, workers), loop in sorted(loops.items(), key=lambda kv: (kv[0][1], kv[0][0] != "device")):
        images = loop.get("images_per_epoch", 0)
        text = f"{loop['img/s']:.0f} img/s, {images:.0f} images an epoch"
        if fp16:
            text = f"{loop['img/s'] / fp16:.2f} of the fp16 step ({text})"
        judged = path == "device" and workers == few and fp16 is not None
        ok = loop["img/s"] / fp16 >= MIN_LOOP_SHARE and images >= MIN_LOOP_IMAGES if judged else None
        rows.append((f"2 loop: --augment-on {path}, {workers} workers", text,
                     f">= {MIN_LOOP_SHARE} of the step, {MIN_LOOP_IMAGES}+ images" if judged else "information", ok))
    return rows


def goals(r: dict) -> list[Row]:
    """(goal, measured, target, met) rows; met None where the figure is missing or is information."""
    steps = r.get("steps", {})
    fp16 = steps.get("fp16", {}).get("img/s")
    rows = _step_rows(steps) + _loop_rows(r.get("loops", {}), fp16)
    nondet, det = r.get("loop_nondet"), next((v for (p, _), v in sorted(r.get("loops", {}).items()) if p == "device"),
                                            None)
    if nondet and det:
        rows.append(("deterministic algorithms (default) cost", f"{det['img/s'] / nondet['img/s']:.2f}x the images/s "
                     f"without ({nondet['img/s']:.0f} img/s)", "information", None))
    if same := r.get("same_run"):
        rows.append(("seeded run twice (deterministic, CUDA default)", f"weights identical: {same['identical_weights']}"
                     f" (max diff {same['max_weight_diff']:.3g})", "identical", same["identical_weights"]))
    small = r.get("loop_small")
    rows.append(("2 loop: yolov5n 192 batch 16, built-in set", f"{small['it/s']:.1f} it/s" if small else "missing",
                 f">= {MIN_SMALL_IT_S:.0f} it/s", small["it/s"] >= MIN_SMALL_IT_S if small else None))
    loader = r.get("loader", {})
    for path in ("device", "host"):
        if path not in loader:
            rows.append((f"3 loader: --augment-on {path}", "missing", "", None))
            continue
        lo = loader[path]
        dev = f"; the device's share {lo['device_s'] * 1e3:.1f} ms a batch" if lo.get("device_s") is not None else ""
        rows.append((f"3 loader: --augment-on {path}, {lo['workers']} workers", f"{lo['img/s']:.0f} img/s{dev}",
                     f">= {MIN_LOADER_RATE:.0f}" if path == "device" else "information",
                     lo["img/s"] >= MIN_LOADER_RATE if path == "device" else None))
    if dec := r.get("decode"):
        gpu = next((v for k, v in dec.items() if k.startswith("decode_jpeg")), None)
        rows.append(("decode (cache off): cv2 on 1 core vs decode_jpeg", f"{dec['cv2 img/s (1 core)']:.0f} vs "
                     f"{gpu:.0f} img/s on {dec.get('device')}" if gpu else "missing", "information", None))
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


def table(rows: list[Row]) -> str:
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
