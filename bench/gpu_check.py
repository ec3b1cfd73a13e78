"""The measuring and judging half of bench/gpu_precision.sh (the shell script runs each step under a time limit).

    python bench/gpu_check.py evals   OUT DATA       # (c) test.py on each best.pt, half and FP32 -> OUT/test.json
    python bench/gpu_check.py detect  OUT DATA       # (d) detect.py half and FP32 at batch 32  -> OUT/detect.json
    python bench/gpu_check.py summary OUT            # one table from everything in OUT; exit 1 if a check fails

OUT holds, from the shell script: amp.json (bench/gpu_amp.py --json), the train.py runs fp16/ and fp32/
(results.csv, weights/best.pt), ddp/ (or ddp.skipped with the reason), and <step>.rc with each step's exit
code. `checks()` turns those numbers into rows with a target each; it is a pure function, so
bench/tests/test_gpu_check.py tries it on made-up numbers.
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# targets (issue 14)
MIN_FP16_STEP_SPEEDUP = 2.0  # fp16 training images/s over FP32's, yolov5s 640 batch 64
MAX_FP16_STEP_MEMORY = 0.6  # fp16 peak memory over FP32's
MIN_FP16_INFER_SPEEDUP = 1.5  # FP16 inference images/s over FP32's at batch 32
MAX_MAP_DIFF = 0.005  # test.py half vs FP32, mAP@0.5 and mAP@0.5:0.95
MIN_BOX_AGREEMENT = 0.95  # share of boxes found by the other precision (same class, IoU >= 0.95)
MATCH_IOU = 0.95
# The GradScaler starts at 2**16 and halves at every overflow: a healthy model settles within a few steps.
# More skips than this in three short epochs mean overflows the scale search does not explain.
MAX_FP16_SKIPS = 8
WEAK_MAP50 = 0.01  # below this (3 epochs from scratch) a mAP comparison says little: the row says so
MIN_BOXES = 20  # fewer FP32 boxes than this and box agreement is noted as weak
RUNS = ("fp16", "fp32")  # train.py runs: --amp fp16 and --amp off
STEPS = ("amp", "train_fp16", "train_fp32", "evals", "detect", "ddp")


@dataclass
class Check:
    section: str
    name: str
    value: str
    target: str
    ok: bool | None  # None: information only, or skipped

    @property
    def verdict(self) -> str:
        return "info" if self.ok is None else "PASS" if self.ok else "FAIL"


# ----------------------------------------------------------------------------------------- reading OUT


def read_results(out: Path) -> dict:
    """Everything the steps left in OUT as plain numbers (missing pieces are simply absent)."""
    res: dict = {"rc": {}}
    for step in STEPS:
        f = out / f"{step}.rc"
        if f.is_file():
            res["rc"][step] = int(f.read_text().strip() or -1)
    for name in ("amp", "test", "detect"):
        f = out / f"{name}.json"
        if f.is_file():
            res[name] = json.loads(f.read_text())
    for run in RUNS:
        f = out / run / "results.csv"
        if f.is_file():
            res.setdefault("train", {})[run] = train_summary(f)
    skipped = out / "ddp.skipped"
    if skipped.is_file():
        res["ddp"] = {"not_run": skipped.read_text().strip()}
    elif (out / "ddp" / "results.csv").is_file():
        res["ddp"] = train_summary(out / "ddp" / "results.csv")
    return res


def train_summary(results_csv: Path) -> dict:
    """Epochs, median epoch seconds (the csv's clock is cumulative), skipped steps and final mAP of a run."""
    rows = list(csv.DictReader(open(results_csv)))
    if not rows:
        return {"epochs": 0}
    clock = [float(r["time"]) for r in rows]
    epoch_s = [b - a for a, b in zip([0.0] + clock, clock)]
    last = rows[-1]
    return {"epochs": len(rows), "epoch_s": statistics.median(epoch_s), "skipped": int(float(last["skipped_steps"])),
            "map50": float(last["metrics/mAP_0.5"]), "map": float(last["metrics/mAP_0.5:0.95"])}


# ----------------------------------------------------------------------------------------- judging


def checks(res: dict) -> list[Check]:
    """Rows of the summary table from read_results' numbers."""
    rows = [Check("steps", f"{step} exited {rc}" + (" (time limit)" if rc == 124 else ""), "see OUT/" + step + ".log",
                  "exit 0", False) for step, rc in res.get("rc", {}).items() if rc != 0]
    rows += _amp_rows(res.get("amp"))
    rows += _train_rows(res.get("train", {}))
    rows += _test_rows(res.get("test"))
    rows += _detect_rows(res.get("detect"))
    rows += _ddp_rows(res.get("ddp"))
    return rows


def _missing(section: str, what: str) -> list[Check]:
    return [Check(section, what, "no result", "a result", False)]


def _amp_rows(amp: list[dict] | None) -> list[Check]:
    s = "(a) train step"
    modes = {r["mode"]: r for r in amp or []}
    if "off" not in modes or "fp16" not in modes:
        return _missing(s, "bench/gpu_amp.py FP32 and fp16")
    f32, f16 = modes["off"], modes["fp16"]
    speed, mem = f16["img/s"] / f32["img/s"], f16["peak GiB"] / f32["peak GiB"]
    rows = [Check(s, "fp16 images/s vs FP32", f"{speed:.2f}x ({f16['img/s']:.0f} vs {f32['img/s']:.0f})",
                  f">= {MIN_FP16_STEP_SPEEDUP:g}x", speed >= MIN_FP16_STEP_SPEEDUP),
            Check(s, "fp16 peak memory vs FP32", f"{mem:.2f}x ({f16['peak GiB']:.1f} vs {f32['peak GiB']:.1f} GiB)",
                  f"<= {MAX_FP16_STEP_MEMORY:g}x", mem <= MAX_FP16_STEP_MEMORY),
            Check(s, "fp16 AMP check", str(f16["amp check"]), "True", bool(f16["amp check"]))]
    if "bf16" in modes:
        b = modes["bf16"]
        rows.append(Check(s, "bf16 images/s, memory vs FP32", f"{b['img/s'] / f32['img/s']:.2f}x, "
                          f"{b['peak GiB'] / f32['peak GiB']:.2f}x (AMP check {b['amp check']})", "-", None))
    return rows


def _train_rows(train: dict) -> list[Check]:
    s = "(b) train.py COCO128"
    rows = []
    for run in RUNS:
        r = train.get(run)
        if not r or r.get("epochs", 0) < 3:
            rows += _missing(s, f"{run}: 3 finished epochs")
            continue
        rows.append(Check(s, f"{run}: epoch s / final mAP@0.5 / mAP@0.5:0.95",
                          f"{r['epoch_s']:.1f} / {r['map50']:.4f} / {r['map']:.4f}", "-", None))
        limit = MAX_FP16_SKIPS if run == "fp16" else 0
        rows.append(Check(s, f"{run}: skipped steps", str(r["skipped"]), f"<= {limit}", r["skipped"] <= limit))
    if all(run in train and train[run].get("epochs", 0) >= 3 for run in RUNS):
        ratio = train["fp32"]["epoch_s"] / train["fp16"]["epoch_s"]
        rows.append(Check(s, "fp16 epoch speed vs FP32", f"{ratio:.2f}x", "-", None))
    return rows


def _test_rows(test: dict | None) -> list[Check]:
    s = "(c) test.py half vs FP32"
    rows = []
    for run in RUNS:
        r = (test or {}).get(run)
        if not r or "half" not in r or "fp32" not in r:
            rows += _missing(s, f"{run}/best.pt in both precisions")
            continue
        h, f = r["half"], r["fp32"]
        diff = max(abs(h["map50"] - f["map50"]), abs(h["map"] - f["map"]))
        weak = " (weak: mAP near 0)" if f["map50"] < WEAK_MAP50 else ""
        value = f"{diff:.4f} (mAP@0.5 {h['map50']:.4f} vs {f['map50']:.4f}){weak}"
        rows.append(Check(s, f"{run}/best.pt max |mAP diff|", value, f"<= {MAX_MAP_DIFF:g}", diff <= MAX_MAP_DIFF))
    return rows


def _detect_rows(det: dict | None) -> list[Check]:
    s = "(d) detect.py half vs FP32"
    if not det or "half" not in det or "fp32" not in det:
        return _missing(s, "both precisions")
    h, f = det["half"], det["fp32"]
    speed = h["img/s"] / f["img/s"]
    weak = f" (weak: {f['boxes']} FP32 boxes)" if f["boxes"] < MIN_BOXES else ""
    return [Check(s, f"FP16 inference images/s vs FP32, batch {det.get('batch', 32)}",
                  f"{speed:.2f}x ({h['img/s']:.0f} vs {f['img/s']:.0f})", f">= {MIN_FP16_INFER_SPEEDUP:g}x",
                  speed >= MIN_FP16_INFER_SPEEDUP),
            Check(s, f"box agreement (same class, IoU >= {MATCH_IOU:g})", f"{det['agreement']:.3f}{weak}",
                  f">= {MIN_BOX_AGREEMENT:g}", det["agreement"] >= MIN_BOX_AGREEMENT)]


def _ddp_rows(ddp: dict | None) -> list[Check]:
    s = "(e) torchrun 2 GPUs"
    if ddp is None:
        return _missing(s, "2-process run or a skip note")
    if "not_run" in ddp:
        return [Check(s, "2-process run", f"skipped: {ddp['not_run']}", "-", None)]
    ok = ddp.get("epochs", 0) >= 1
    return [Check(s, "2-process fp16 run: epochs / skipped / epoch s",
                  f"{ddp.get('epochs', 0)} / {ddp.get('skipped', '-')} / {ddp.get('epoch_s', float('nan')):.1f}",
                  ">= 1 epoch", ok)]


def table(rows: list[Check]) -> str:
    widths = [max(len(x) for x in col) for col in zip(("section", "check", "value", "target"),
                                                        *((r.section, r.name, r.value, r.target) for r in rows))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines = [fmt.format("section", "check", "value", "target", "result")]
    lines += [fmt.format(r.section, r.name, r.value, r.target, r.verdict) for r in rows]
    failed = sum(r.ok is False for r in rows)
    lines.append(f"{'FAIL' if failed else 'PASS'}: {failed} of {sum(r.ok is not None for r in rows)} checks failed")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- boxes


def read_labels(folder: Path) -> dict[str, np.ndarray]:
    """detect.py --save-txt --save-conf files: per image stem, rows cls, x1, y1, x2, y2 (normalised)."""
    out = {}
    for f in sorted(Path(folder).glob("*.txt")):
        rows = np.loadtxt(f, ndmin=2).reshape(-1, 6) if f.stat().st_size else np.zeros((0, 6))
        xy, wh = rows[:, 1:3], rows[:, 3:5]
        out[f.stem] = np.concatenate([rows[:, :1], xy - wh / 2, xy + wh / 2], 1)
    return out


def box_agreement(a: dict[str, np.ndarray], b: dict[str, np.ndarray], iou_min: float = MATCH_IOU) -> float:
    """Share of all boxes of both sets that have a same-class box with IoU >= iou_min in the other set
    (1.0 when neither has a box)."""
    matched = total = 0
    for stem in set(a) | set(b):
        x, y = a.get(stem, np.zeros((0, 5))), b.get(stem, np.zeros((0, 5)))
        total += len(x) + len(y)
        if not len(x) or not len(y):
            continue
        iou = _iou(x[:, 1:], y[:, 1:])
        iou[x[:, None, 0] != y[None, :, 0]] = 0
        matched += int((iou.max(1) >= iou_min).sum() + (iou.max(0) >= iou_min).sum())
    return matched / total if total else 1.0


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area_a, area_b = (a[:, 2:] - a[:, :2]).prod(1), (b[:, 2:] - b[:, :2]).prod(1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-12)


# ----------------------------------------------------------------------------------------- measuring (GPU)


def evals(out: Path, data: str, device: str = "0", imgsz: int = 640, batch: int = 32) -> None:
    """(c): test.py on each run's best.pt with --half and with --no-half."""
    import validator as evaluator

    res = {}
    for run in RUNS:
        best = out / run / "weights" / "best.pt"
        if not best.is_file():
            continue
        res[run] = {}
        for name, half in (("half", True), ("fp32", False)):
            r = evaluator.run(data, weights=best, batch_size=batch, imgsz=imgsz, device=device, half=half, plots=False,
                              workers=8)
            res[run][name] = {"map50": r.map50, "map": r.map, "ms_inference": r.speed["inference"]}
    (out / "test.json").write_text(json.dumps(res, indent=1))


def detect_speed(out: Path, data: str, device: str = "0", imgsz: int = 640, batch: int = 32) -> None:
    """(d): detect.py over the COCO128 images with --half and --no-half: inference images/s, box agreement."""
    import detect
    from utils.data.data_config import load_data_config

    source = str(load_data_config(data)["val"][0])
    res: dict = {"batch": batch}
    labels = {}
    for name, half in (("half", True), ("fp32", False)):
        opts = detect.DetectOptions(weights=str(out / "fp16" / "weights" / "best.pt"), source=source, imgsz=imgsz,
                                    device=device, half=half, save_txt=True, save_conf=True, nosave=True,
                                    project=str(out / "detect"), name=name, exist_ok=True, batch_size=batch)
        r = detect.detect(opts)
        labels[name] = read_labels(r.save_dir / "labels")
        boxes = sum(len(v) for v in labels[name].values())
        res[name] = {"img/s": 1e3 / max(r.speed["inference"], 1e-9), "boxes": boxes}
    res["agreement"] = box_agreement(labels["half"], labels["fp32"])
    (out / "detect.json").write_text(json.dumps(res, indent=1))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("evals", "detect", "summary") or (argv[0] != "summary" and len(argv) < 3):
        print("usage: python bench/gpu_check.py evals|detect OUT DATA  |  python bench/gpu_check.py summary OUT")
        return 2
    out = Path(argv[1])
    if argv[0] == "summary":
        rows = checks(read_results(out))
        print(table(rows))
        return 1 if any(r.ok is False for r in rows) else 0
    from utils.errors import setup_logging

    setup_logging()  # test.py's and detect.py's own tables go to the step's log
    {"evals": evals, "detect": detect_speed}[argv[0]](out, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
