"""The GPU check: training at the GPU's speed and in its precisions, measured in one go and judged in one table.

    python bench/gpu_check.py run [--data COCO128_YAML] [--part step precision throughput] [--budget 540] [--out DIR]
    python bench/gpu_check.py summary OUT [--part ...]    # the table again from what a run left in OUT
    python bench/gpu_check.py run --tiny --data DATA.yaml  # every step on the CPU at toy sizes (yolov5n, 64 px)

Each step is a command under its own time limit, all inside --budget seconds, most important first; logs, exit
codes and results go to OUT (default bench/out/gpu_check/<time>/; two calls may share one OUT).
  step        bench/speed.py step, yolov5s 640 batch 64: FP32 with TF32, fp16 with foreach and with fused AdamW
              (train.py's), bf16, fp16 from CUDA graphs: images/s, peak memory, AMP check
  precision   train.py on COCO128 (yolov5s 640, 3 epochs) in fp16 and FP32; test.py on each best.pt in half and
              FP32; bench/speed.py detect in FP32 and FP16 at batch 32 (box agreement); torchrun on 2 GPUs
  throughput  bench/speed.py loop on COCO128 x 16 (2,048 images), --augment-on device and host, 8 and 16 workers;
              the loader; decode; fp16-compile; 10 epochs of ours and of YOLOv5 7.0.14 (the kit, --y5) on the
              built-in set; a seeded run twice; the loop without deterministic algorithms; yolov5n 192's loop
Exit: 0 every goal met, 1 one missed, 2 no GPU or no dataset (nothing run). `checks` is a pure function of what
OUT holds: bench/tests/test_gpu_check.py judges made-up numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.report.results import read_records  # noqa: E402

PARTS = ("step", "precision", "throughput")
HOME = os.environ.get("AMPYOLO_HOME", "/tmp/ah")  # where the steps' train.py keeps the built-in set
RUNS = ("fp16", "fp32")  # train.py --amp fp16 and --amp off
# targets
MIN_STEP_SPEEDUP = 2.0  # fp16 training images/s over TF32's (train.py's step, or the best candidate)
MIN_STEP_RATE = 2000.0  # fp16 images/s, yolov5s 640 batch 64
MAX_STEP_MEMORY = 0.6  # fp16 peak memory over TF32's
MIN_INFER_SPEEDUP = 1.5  # FP16 inference images/s over FP32's at batch 32
MAX_MAP_DIFF = 0.005  # test.py half vs FP32
MIN_BOX_AGREEMENT, MATCH_IOU = 0.95, 0.95  # share of boxes the other precision finds (same class, IoU >= 0.95)
MAX_FP16_SKIPS = 8  # the scaler starts at 2**16 and halves per overflow: a healthy model settles in a few steps
MIN_LOOP_SHARE, MIN_LOOP_IMAGES = 0.85, 2048  # the loop's images/s over the fp16 step's, on 2,048+ images
MIN_SMALL_IT_S = 40.0  # yolov5n 192 batch 16, the built-in set
MIN_LOADER_RATE = 2000.0  # the workers' images/s at 640, device path, 16 workers
MIN_PEER_SPEEDUP = 2.0  # YOLOv5's wall time over ours, same data and epochs


# ----------------------------------------------------------------------------------------------------- running


def plan(a: argparse.Namespace, out: Path) -> list[tuple[str, str, int, list[str]]]:
    """(part, step name, time limit s, command) in the order they run."""
    py, speed, tiny, ngpu = sys.executable, [sys.executable, "bench/speed.py"], a.tiny, gpu_count()
    dev, cfg, img, batch, copies, w1, w2, amp = (("cpu", "yolov5n.yaml", "64", 8, "2", 1, 2, "off") if tiny else
                                                 ("0", "yolov5s.yaml", "640", 64, "16", 8, 16, "fp16"))
    step = [*speed, "step", "--cfg", cfg, "--imgsz", img, "--batch", str(batch // 2 if tiny else batch), "--device",
            dev, *(["--steps", "1", "--compile-backend", "eager"] if tiny else ["--steps", "20", "--warmup", "5"])]
    small = ["--data", a.data, "--imgsz", "64"] if tiny else []  # the built-in set, at its size
    data, y5 = str(out / "data" / "repeat.yaml"), Path(a.y5).resolve()
    train = [py, "train.py", "--data", a.data, "--cfg", cfg, "--imgsz", img, "--batch-size", str(batch // 4),
             "--epochs", "1" if tiny else "3", "--workers", str(w1), "--device", dev, "--seed", "0", "--noplots",
             "--project", str(out), "--exist-ok"]

    def loop(name: str, aug: str, workers: int, *more: str) -> tuple:
        return ("throughput", name, 60, [*speed, "loop", "--data", data, "--cfg", cfg, "--imgsz", img, "--batch-size",
                                         str(batch), "--cache", "ram", "--epochs", "2" if tiny else "3", "--workers",
                                         str(workers), "--device", dev, "--amp", amp, "--augment-on", aug, "--json",
                                         str(out / f"{name}.json"), *more])

    steps = [("step", "steps", 150, [*step, "--candidates", "fp32", "fp16-foreach", "fp16", "bf16", "fp16-graphs",
                                     "--json", str(out / "steps.json")]),
             ("precision", "train_fp16", 110, [*train, "--name", "fp16", "--amp", "fp16"]),
             ("precision", "train_fp32", 110, [*train, "--name", "fp32", "--amp", "off"]),
             ("precision", "evals", 60, [py, "bench/gpu_check.py", "evals", str(out), a.data, "--device", dev,
                                         "--imgsz", img]),
             ("precision", "detect", 45, [*speed, "detect", "--weights", str(out / "fp16/weights/best.pt"), "--source",
                                          str(val_images(a.data)), "--imgsz", img, "--device", dev, "--precisions",
                                          "fp32", "fp16", "--batch-sizes", str(batch // 2), "--nosave", "--save-txt",
                                          "--project", str(out / "detect"), "--json", str(out / "detect.json")]),
             *([("precision", "ddp", 70, [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                          *train[1:], "--device", "0,1", "--epochs", "1", "--name", "ddp", "--amp",
                                          "fp16"])] if ngpu >= 2 else []),
             ("throughput", "data", 60, [*speed, "loader", "--repeat", copies, "--data", a.data, "--out", f"{out}/data"]),
             *(loop(f"loop_{aug}_w{w}", aug, w) for w in (w1, w2) for aug in ("device", "host")),
             ("throughput", "loader", 60, [*speed, "loader", "--data", data, "--imgsz", img, "--workers", str(w2),
                                           "--cache", "ram", "--batch-size", str(batch), "--augment-on", "host",
                                           "device", "--device", dev, "--batches", "2" if tiny else "20"]),
             ("throughput", "decode", 30, [*speed, "loader", "--decode", "--data", a.data, "--device", dev, "--json",
                                           str(out / "decode.json")]),
             ("throughput", "compile", 150, [*step, "--candidates", "fp16-compile", "--json", f"{out}/compile.json"]),
             ("throughput", "ours", 80, [py, "train.py", *small, "--epochs", "1" if tiny else "10", "--device", dev,
                                         "--workers", "8", "--seed", "0", "--noplots", "--project", str(out / "runs"),
                                         "--name", "ours", "--exist-ok"]),
             *([yolov5_step(py, y5, out)] if not tiny and (y5 / "yolov5").is_dir() else []),
             ("throughput", "same_run", 60, [*speed, "same-run", *small, "--epochs", "1" if tiny else "2", "--device",
                                             dev, "--json", f"{out}/same_run.json"]),
             loop("loop_nondet", "device", w1, "--deterministic", "off"),
             ("throughput", "loop_small", 50, [*speed, "loop", *small, "--epochs", "3", "--workers", str(w1), "--device",
                                               dev, "--json", str(out / "loop_small.json")])]
    if ngpu < 2:
        (out / "ddp.skipped").write_text(f"the machine has {ngpu} GPU; a 2-process run needs 2\n")
    if any(name == "yolov5" for _, name, *_ in steps):
        (out / "shapes_y5.yaml").write_text(f"path: {HOME}/shapes\ntrain: images/train\nval: images/val\n"
                                            "names: [circle, square, triangle, star, cross]\n")
        Path("/tmp/y5cfg").mkdir(exist_ok=True)
        for font in y5.glob("*.ttf"):  # placed, so that YOLOv5 never downloads one
            shutil.copy(font, "/tmp/y5cfg")
    return [s for s in steps if s[0] in a.part]


def yolov5_step(py: str, y5: Path, out: Path) -> tuple[str, str, int, list[str]]:
    """YOLOv5 7.0.14 from the unpacked kit, 10 epochs on the built-in set beside ours (no download: YOLO_OFFLINE)."""
    return ("throughput", "yolov5", 120, [
        "env", f"PYTHONPATH={y5}", "YOLOV5_CONFIG_DIR=/tmp/y5cfg", "YOLO_OFFLINE=1", "WANDB_MODE=disabled",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1", py, "-m", "yolov5.train", "--weights", "", "--cfg",
        f"{y5}/yolov5/models/yolov5n.yaml", "--data", f"{out}/shapes_y5.yaml", "--epochs", "10", "--imgsz", "192",
        "--batch-size", "16", "--workers", "8", "--device", "0", "--seed", "0", "--project", str(out / "runs"),
        "--name", "yolov5"])


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def val_images(data: str) -> Path:
    from utils.data.data_config import load_data_config

    val = load_data_config(data)["val"]
    return Path(val[0] if isinstance(val, list) else val)


def run_steps(a: argparse.Namespace) -> int:
    if not a.tiny and gpu_count() < 1:
        print("gpu_check: no CUDA device here (torch sees none); run it on a machine with a GPU", file=sys.stderr)
        return 2
    if not Path(a.data).is_file():
        print(f"gpu_check: {a.data} not found; pass the COCO128 data YAML with --data", file=sys.stderr)
        return 2
    out = Path(a.out or ROOT / "bench" / "out" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = (out / "parts").read_text().split() if (out / "parts").is_file() else []
    (out / "parts").write_text(" ".join(p for p in PARTS if p in a.part or p in before))  # two calls, one OUT
    deadline = time.monotonic() + a.budget
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLCONFIGDIR": "/tmp/mpl", "AMPYOLO_HOME": HOME}
    for _, name, limit, cmd in plan(a, out):
        limit = min(limit, int(deadline - time.monotonic() - 15))
        if limit <= 0:
            print(f"== {name}: no time left in the budget")
            (out / f"{name}.rc").write_text("124\n")
            continue
        print(f"== {name} (at most {limit}s): {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        with open(out / f"{name}.log", "w") as log:
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the step and its loader workers
                p.wait()
                rc = 124
        (out / f"{name}.rc").write_text(f"{rc}\n")
        (out / f"{name}.seconds").write_text(f"{time.monotonic() - t0:.0f}\n")
        print("".join((out / f"{name}.log").read_text().splitlines(True)[-2:]), end="", flush=True)
    print(f"== summary (logs in {out})")
    return summary(out)


def evals(a: argparse.Namespace) -> None:
    """test.py on each run's best.pt with --half and with --no-half -> OUT/test.json."""
    import validator

    res = {}
    for run in RUNS:
        best = Path(a.out) / run / "weights" / "best.pt"
        if best.is_file():
            res[run] = {name: {"map50": r.map50, "map": r.map} for name, r in (
                (name, validator.run(a.data, weights=best, batch_size=32, imgsz=a.imgsz, device=a.device, half=half,
                                     plots=False, workers=8)) for name, half in (("half", True), ("fp32", False)))}
    (Path(a.out) / "test.json").write_text(json.dumps(res, indent=1))


# ----------------------------------------------------------------------------------------------------- judging


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def train_summary(results_csv: Path) -> dict | None:
    """Epochs, median epoch seconds (the csv's clock is cumulative), skipped steps and final mAP of a run."""
    try:
        rows = read_records(results_csv)
    except OSError:
        return None
    if not rows:
        return {"epochs": 0}
    clock = [float(r["time"]) for r in rows]
    epoch_s = sorted(b - a for a, b in zip([0.0] + clock, clock))
    last = rows[-1]
    return {"epochs": len(rows), "epoch_s": epoch_s[len(epoch_s) // 2], "skipped": int(float(last["skipped_steps"])),
            "map50": float(last["metrics/mAP_0.5"]), "map": float(last["metrics/mAP_0.5:0.95"])}


def read_labels(folder: Path) -> dict:
    """detect.py --save-txt --save-conf files: per image stem, a tensor of rows cls, x1, y1, x2, y2."""
    import numpy as np
    import torch

    from utils.boxes import xywh2xyxy

    rows = {f.stem: torch.from_numpy(np.loadtxt(f, ndmin=2).reshape(-1, 6) if f.stat().st_size else np.zeros((0, 6)))
            for f in sorted(Path(folder).glob("*.txt"))}
    return {stem: torch.cat([r[:, :1], xywh2xyxy(r[:, 1:5])], 1) for stem, r in rows.items()}


def box_agreement(a: dict, b: dict, iou_min: float = MATCH_IOU) -> float:
    """Share of all boxes of both sets that have a same-class box with IoU >= iou_min in the other (1.0: none)."""
    import torch

    from utils.report.metrics import box_iou

    matched = total = 0
    for stem in set(a) | set(b):
        x, y = (torch.as_tensor(s.get(stem, torch.zeros(0, 5)), dtype=torch.float64).reshape(-1, 5) for s in (a, b))
        total += len(x) + len(y)
        if len(x) and len(y):
            iou = box_iou(x[:, 1:], y[:, 1:]) * (x[:, None, 0] == y[None, :, 0])
            matched += int((iou.max(1).values >= iou_min).sum() + (iou.max(0).values >= iou_min).sum())
    return matched / total if total else 1.0


def read_out(out: Path) -> dict:
    """Everything the steps left in OUT as plain numbers (missing pieces are simply absent)."""
    r: dict = {"rc": {f.stem: int(f.read_text().strip() or -1) for f in sorted(out.glob("*.rc"))}, "loops": {}}
    for name in ("test", "detect", "same_run", "decode", "loop_small", "loop_nondet"):
        if (v := _json(out / f"{name}.json")) is not None:
            r[name] = v[0] if name.startswith("loop") and isinstance(v, list) else v
    r["steps"] = {row["candidate"]: row for name in ("steps", "compile") for row in _json(out / f"{name}.json") or []}
    for f in sorted(out.glob("loop_*_w*.json")):
        path, workers = f.stem.split("_")[1:]
        if v := _json(f):
            r["loops"][path, int(workers[1:])] = v[0]
    r["train"] = {run: s for run in (*RUNS, "ddp") if (s := train_summary(out / run / "results.csv"))}
    if (out / "ddp.skipped").is_file():
        r["train"]["ddp"] = {"not_run": (out / "ddp.skipped").read_text().strip()}
    if isinstance(r.get("detect"), list):
        d = r["detect"] = {row["precision"]: row for row in r["detect"]}
        if set(RUNS) <= set(d):
            d["agreement"] = box_agreement(*(read_labels(Path(d[p]["save_dir"]) / "labels") for p in RUNS))
    try:  # bench/speed.py loader's table: imgsz, cache, workers, augment, images/s, device s/batch
        for row in (ln.split() for ln in (out / "loader.log").read_text().splitlines()):
            if len(row) == 6 and row[0].isdigit() and row[3] in ("host", "device"):
                r.setdefault("loader", {})[row[3]] = float(row[4]), int(row[2]), None if row[5] == "-" else float(row[5])
    except OSError:
        pass
    for name in ("ours", "yolov5"):
        try:
            r[name] = {"map": float(read_records(out / "runs" / name / "results.csv")[-1]["metrics/mAP_0.5:0.95"]),
                       "seconds": float(_json(out / f"{name}.seconds") or "nan")}
        except (OSError, IndexError, KeyError, ValueError):
            pass
    return r


def part_of(step: str) -> str:
    return "step" if step == "steps" else "precision" if step in ("train_fp16", "train_fp32", "evals", "detect", "ddp") \
        else "throughput"


def row(part: str, goal: str, measured: str, target: str = "information", ok: bool | None = None) -> tuple:
    return part, goal, measured, target, ok


def checks(r: dict, parts: tuple[str, ...] = PARTS) -> list[tuple]:
    """(part, goal, measured, target, met) rows; met None for information. A missing figure is a failure."""
    rows = [row(part_of(name), f"{name} exited {rc}" + " (time limit)" * (rc == 124), f"see OUT/{name}.log",
                "exit 0", False) for name, rc in r["rc"].items() if rc]
    steps = r.get("steps", {})
    tf32, fp16 = steps.get("fp32", {}), steps.get("fp16", {})
    if "img/s" in tf32 and "img/s" in fp16:
        speed = fp16["img/s"] / tf32["img/s"]
        rows.append(row("step", "fp16 (train.py's) over TF32", f"{speed:.2f}x ({fp16['img/s']:.0f} vs "
                        f"{tf32['img/s']:.0f} img/s)", f">= {MIN_STEP_SPEEDUP}x", speed >= MIN_STEP_SPEEDUP))
        rows.append(row("step", "fp16 images/s", f"{fp16['img/s']:.0f}", f">= {MIN_STEP_RATE:.0f}",
                        fp16["img/s"] >= MIN_STEP_RATE))
        if "peak GiB" in fp16:
            mem = fp16["peak GiB"] / tf32["peak GiB"]
            rows += [row("step", "fp16 peak memory over TF32", f"{mem:.2f}x", f"<= {MAX_STEP_MEMORY}x",
                         mem <= MAX_STEP_MEMORY),
                     row("step", "fp16 AMP check", str(fp16["amp check"]), "True", bool(fp16["amp check"]))]
    else:
        rows.append(row("step", "fp16 and TF32 steps", "missing", "a figure", False))
    for name, s in steps.items():
        if name not in ("fp32", "fp16"):
            note = f", compiled in {s['compile s']:.0f} s" if "compile s" in s else ""
            rows.append(row("step", f"candidate {name}", f"{s['img/s']:.0f} img/s" + (
                f", {s['img/s'] / fp16['img/s']:.2f}x fp16" if "img/s" in fp16 else "") + note if "img/s" in s
                else s.get("skipped") or s.get("error", "no figure")))
    best = max((s for n, s in steps.items() if n.startswith("fp16") and "img/s" in s), key=lambda s: s["img/s"],
               default=None)
    if best and "img/s" in tf32:
        speed = best["img/s"] / tf32["img/s"]
        rows.append(row("step", "best fp16 candidate over TF32", f"{speed:.2f}x ({best['candidate']})",
                        f">= {MIN_STEP_SPEEDUP}x", speed >= MIN_STEP_SPEEDUP))
    if "precision" in parts:
        rows += precision_checks(r)
    if "throughput" in parts:
        rows += throughput_checks(r, fp16.get("img/s"))
    return [x for x in rows if x[0] in parts]


def precision_checks(r: dict) -> list[tuple]:
    rows, train, test, det = [], r.get("train", {}), r.get("test") or {}, r.get("detect") or {}
    for run in RUNS:
        t = train.get(run, {})
        if t.get("epochs", 0) < 1:
            rows.append(row("precision", f"train {run}: finished epochs", "missing", ">= 1", False))
            continue
        limit = MAX_FP16_SKIPS if run == "fp16" else 0
        rows += [row("precision", f"train {run}: epochs / epoch s / final mAP@0.5, mAP@0.5:0.95",
                     f"{t['epochs']} / {t['epoch_s']:.1f} / {t['map50']:.4f}, {t['map']:.4f}"),
                 row("precision", f"train {run}: skipped steps", f"{t['skipped']}", f"<= {limit}", t["skipped"] <= limit)]
        h, f = (test.get(run) or {}).get("half"), (test.get(run) or {}).get("fp32")
        diff = max(abs(h["map50"] - f["map50"]), abs(h["map"] - f["map"])) if h and f else None
        rows.append(row("precision", f"test.py {run}/best.pt half vs FP32: max |mAP diff|", "missing" if diff is None
                        else f"{diff:.4f} (mAP@0.5 {h['map50']:.4f} vs {f['map50']:.4f})", f"<= {MAX_MAP_DIFF}",
                        diff is not None and diff <= MAX_MAP_DIFF))
    if "fp16" in det and "fp32" in det:
        speed = det["fp32"]["inference ms"] / max(det["fp16"]["inference ms"], 1e-9)
        rows += [row("precision", f"detect.py FP16 inference over FP32, batch {det['fp16']['batch']}", f"{speed:.2f}x",
                     f">= {MIN_INFER_SPEEDUP}x", speed >= MIN_INFER_SPEEDUP),
                 row("precision", f"detect.py box agreement (same class, IoU >= {MATCH_IOU})",
                     f"{det['agreement']:.3f}", f">= {MIN_BOX_AGREEMENT}", det["agreement"] >= MIN_BOX_AGREEMENT)]
    else:
        rows.append(row("precision", "detect.py in both precisions", "missing", "a figure", False))
    ddp = train.get("ddp", {})
    rows.append(row("precision", "torchrun 2 GPUs", f"skipped: {ddp['not_run']}") if "not_run" in ddp else
                row("precision", "torchrun 2 GPUs: epochs / skipped", f"{ddp.get('epochs', 0)} / {ddp.get('skipped')}",
                    ">= 1 epoch", ddp.get("epochs", 0) >= 1))
    return rows


def throughput_checks(r: dict, fp16: float | None) -> list[tuple]:
    rows, loops = [], r.get("loops", {})
    few = min((w for _, w in loops), default=0)
    for (path, workers), lp in sorted(loops.items(), key=lambda kv: (kv[0][1], kv[0][0] != "device")):
        text = f"{lp['img/s']:.0f} img/s, {lp['images_per_epoch']:.0f} images an epoch"
        judged = path == "device" and workers == few and fp16 is not None
        rows.append(row("throughput", f"loop: --augment-on {path}, {workers} workers", (
            f"{lp['img/s'] / fp16:.2f} of the fp16 step ({text})" if fp16 else text), *((
                f">= {MIN_LOOP_SHARE} of the step, {MIN_LOOP_IMAGES}+ images", lp["img/s"] / fp16 >= MIN_LOOP_SHARE
                and lp["images_per_epoch"] >= MIN_LOOP_IMAGES) if judged else ())))
    if not loops:
        rows.append(row("throughput", "loop: 2,048 images", "missing", "a figure", False))
    if (nondet := r.get("loop_nondet")) and (det := loops.get(("device", few))):
        rows.append(row("throughput", "deterministic algorithms (default) cost",
                        f"{det['img/s'] / nondet['img/s']:.2f}x the images/s without ({nondet['img/s']:.0f} img/s)"))
    same, small = r.get("same_run"), r.get("loop_small")
    rows += [row("throughput", "seeded run twice (deterministic, CUDA default)", f"weights identical: "
                 f"{same['identical_weights']} (max diff {same['max_weight_diff']:.3g})" if same else "missing",
                 "identical", bool(same and same["identical_weights"])),
             row("throughput", "loop: yolov5n 192 batch 16, built-in set", f"{small['it/s']:.1f} it/s" if small else
                 "missing", f">= {MIN_SMALL_IT_S:.0f} it/s", bool(small and small["it/s"] >= MIN_SMALL_IT_S))]
    for path in ("device", "host"):
        rate, workers, dev_s = r.get("loader", {}).get(path, (None, 0, None))
        share = f"; the device's share {dev_s * 1e3:.1f} ms a batch" if dev_s is not None else ""
        rows.append(row("throughput", f"loader: --augment-on {path}, {workers} workers", "missing" if rate is None
                        else f"{rate:.0f} img/s{share}", *((f">= {MIN_LOADER_RATE:.0f}", rate is not None and
                                                              rate >= MIN_LOADER_RATE) if path == "device" else ())))
    if dec := r.get("decode"):
        gpu = next((v for k, v in dec.items() if k.startswith("decode_jpeg")), float("nan"))
        rows.append(row("throughput", "decode (cache off): cv2 on 1 core vs decode_jpeg",
                        f"{dec['cv2 img/s (1 core)']:.0f} vs {gpu:.0f} img/s on {dec['device']}"))
    ours, y5 = r.get("ours"), r.get("yolov5")
    if ours and y5:
        speed = y5["seconds"] / ours["seconds"]
        rows += [row("throughput", "peers: YOLOv5's time over ours", f"{speed:.2f}x ({y5['seconds']:.0f} s vs "
                     f"{ours['seconds']:.0f} s)", f">= {MIN_PEER_SPEEDUP}x", speed >= MIN_PEER_SPEEDUP),
                 row("throughput", "peers: mAP@0.5:0.95 ours vs YOLOv5", f"{ours['map']:.3f} vs {y5['map']:.3f}",
                     ">= YOLOv5's", ours["map"] >= y5["map"])]
    else:
        rows.append(row("throughput", "peers: ours and YOLOv5 10 epochs", "missing", "a figure", False))
    return rows


def table(rows: list[tuple]) -> str:
    verdict = {True: "met", False: "MISSED", None: "-"}
    lines = ["| part | goal | measured | target | |", "|---|---|---|---|---|"]
    lines += [f"| {p} | {g} | {m} | {t} | {verdict[ok]} |" for p, g, m, t, ok in rows]
    missed = sum(ok is False for *_, ok in rows)
    return "\n".join(lines + [f"{'FAIL' if missed else 'PASS'}: {missed} of {sum(x[4] is not None for x in rows)} "
                              "goals missed"])


def summary(out: Path, parts: tuple[str, ...] | None = None) -> int:
    parts = tuple(parts or ((out / "parts").read_text().split() if (out / "parts").is_file() else PARTS))
    rows = checks(read_out(out), parts)
    print(table(rows))
    return 1 if any(ok is False for *_, ok in rows) else 0


def main(argv: list[str] | None = None) -> int:
    from bench.speed import options

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    run = options(sub.add_parser("run"), data=str(ROOT.parent / "shared" / "datasets" / "coco128" / "coco128.yaml"),
                  budget=int(os.environ.get("GPU_CHECK_BUDGET_S", 540)), out=None, y5=str(ROOT / ".y5"), tiny=False)
    (judge := sub.add_parser("summary")).add_argument("out", type=Path)
    for s, default in ((run, list(PARTS)), (judge, None)):
        s.add_argument("--part", nargs="+", choices=PARTS, default=default)
    evals_ = options(sub.add_parser("evals"), device="0", imgsz=640)
    evals_.add_argument("out")
    evals_.add_argument("data")
    a = p.parse_args(argv)
    return evals(a) or 0 if a.cmd == "evals" else summary(a.out, a.part) if a.cmd == "summary" else run_steps(a)


if __name__ == "__main__":
    sys.exit(main())
