"""YOLOv5 checkpoints in (issue 12): our loader beside YOLOv5 7.0.14's own, on files YOLOv5 itself wrote.

    python bench/yolov5_import_check.py --ckpt OUR_TRAINED.pt [--data coco128.yaml] [--imgsz 640]

Needs the peer venv (/tmp/peer-venv, built by ../shared/bench/peers.sh); CI does not run this.

1. Files written by YOLOv5: our trained weights are loaded into YOLOv5's own DetectionModel (built from the
   same YAML in the peer venv; the state-dict keys are the same) and saved the way YOLOv5's train.py saves
   (last.pt: FP16 model and EMA, optimizer, numpy best_fitness, vars(opt)), then stripped with YOLOv5's
   own strip_optimizer (best.pt); once under the pip package's names (yolov5.models.*) and once under the
   repository layout's (models.*). --yolov5-trained adds a file YOLOv5 wrote while training.
2. Equal outputs: each file through YOLOv5's attempt_load and through our load_model, FP16 weights and FP32
   compute, decoded predictions on the same images; max |diff| (target 1e-3), unfused and fused.
3. mAP: our test.py and YOLOv5's val.py on the stripped file, same thresholds (target: within 0.005).
4. Fine-tuning: train.py --weights <that file> for --finetune-epochs; its first validation beside the same
   run from our original checkpoint (same weights, our format), from the YOLOv5 file with learning rates 0
   (only BatchNorm statistics move: the start itself), and from scratch.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import train  # noqa: E402
import validator as evaluator  # noqa: E402
from models.yolo import load_model  # noqa: E402
from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.engine.checkpoint import load_checkpoint  # noqa: E402
from utils.files import load_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PEER_PY = Path("/tmp/peer-venv/bin/python")
COCO128_DATA = SHARED_COCO128 / "coco128.yaml"
TOLERANCE_OUT, TOLERANCE_MAP = 1e-3, 0.005
VAL_LINE = re.compile(r"^\s*all\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)

# Runs in the peer venv. `write LAYOUT SRC OUT_DIR`: our tensors in YOLOv5's DetectionModel, saved as its
# train.py saves, then strip_optimizer. `outputs WEIGHTS INPUT OUT`: attempt_load's predictions.
PEER = r'''
import os, sys, datetime
from copy import deepcopy
import numpy as np, torch, yaml, yolov5
mode = sys.argv[1]
if mode == "write":
    layout, src, out = sys.argv[2:5]
    if layout == "repo":  # the repository layout: classes pickled as models.yolo.* / models.common.*
        sys.path.insert(0, os.path.dirname(yolov5.__file__))
        from models.yolo import DetectionModel
        from utils.general import strip_optimizer
    else:
        from yolov5.models.yolo import DetectionModel
        from yolov5.utils.general import strip_optimizer
    from yolov5.train import parse_opt
    ours = torch.load(src, weights_only=True)
    cfg = os.path.join(out, "model.yaml")
    yaml.safe_dump(ours["yaml"], open(cfg, "w"), sort_keys=False)
    model = DetectionModel(cfg, ch=3, nc=ours["nc"])
    model.load_state_dict({k: v.float() for k, v in ours["state"].items()}, strict=True)
    hyp = yaml.safe_load(open(os.path.join(os.path.dirname(yolov5.__file__), "data/hyps/hyp.scratch-low.yaml")))
    model.nc, model.hyp, model.names = ours["nc"], hyp, dict(enumerate(ours["names"]))  # as train.py attaches them
    model.class_weights = torch.ones(ours["nc"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    opt = parse_opt(True)
    # train.main turns the path options into text (check_file, str(opt.project), str(increment_path(...)))
    opt = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in vars(opt).items()}
    opt["hyp"] = hyp
    ckpt = {"epoch": 0, "best_fitness": np.array([0.1]), "model": deepcopy(model).half(),
            "ema": deepcopy(model).half(), "updates": 8, "optimizer": optimizer.state_dict(), "opt": opt,
            "date": datetime.datetime.now().isoformat(), "yolov5pip_version": yolov5.__version__}
    last, best = os.path.join(out, f"{layout}_last.pt"), os.path.join(out, f"{layout}_best.pt")
    torch.save(ckpt, last)
    torch.save(ckpt, best)
    strip_optimizer(best)
elif mode == "outputs":
    from yolov5.models.experimental import attempt_load
    weights, inp, out = sys.argv[2:5]
    x = torch.load(inp)
    res = {}
    for fuse in (False, True):
        model = attempt_load(weights, device="cpu", fuse=fuse).float().eval()
        with torch.no_grad():
            res["fused" if fuse else "raw"] = model(x)[0]
    torch.save(res, out)
'''


def peer_env(cfg: Path) -> dict:
    """Offline YOLOv5: its own config folder with the fonts it would otherwise download, no loggers."""
    font = subprocess.run([str(PEER_PY), "-c", "import matplotlib,os;print(os.path.join(matplotlib.get_data_path(),"
                           "'fonts/ttf/DejaVuSans.ttf'))"], capture_output=True, text=True, check=True).stdout.split()[-1]
    cfg.mkdir(parents=True, exist_ok=True)
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        shutil.copy(font, cfg / name)
    # YOLOv5 7.0.14 unpickles whole modules; torch >= 2.6 refuses that unless forced (their process, not ours)
    return {**os.environ, "YOLOV5_CONFIG_DIR": str(cfg), "MPLCONFIGDIR": str(cfg / "mpl"),
            "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled",
            "COMET_MODE": "disabled", "CLEARML_OFF": "1", "YOLO_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def peer(args: list[str], env: dict, cwd: Path) -> str:
    r = subprocess.run([str(PEER_PY), *args], capture_output=True, text=True, env=env, cwd=cwd)
    if r.returncode:
        sys.exit(f"peer step {args[:3]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def probe_images(data: dict, imgsz: int, n: int = 3) -> torch.Tensor:
    """n real images squashed to imgsz x imgsz plus one of noise, RGB in [0, 1]."""
    folder = Path(data["val"]) if not isinstance(data["val"], list) else Path(data["val"][0])
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:n]
    imgs = [torch.from_numpy(cv2.resize(cv2.imread(str(f)), (imgsz, imgsz))[:, :, ::-1].copy()).permute(2, 0, 1)
            for f in files]
    real = torch.stack(imgs).float() / 255
    return torch.cat((real, torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))))


def compare_outputs(weights: Path, x: torch.Tensor, tmp: Path, env: dict) -> dict[str, float]:
    torch.save(x, tmp / "probe.pt")
    peer(["-c", PEER, "outputs", str(weights), str(tmp / "probe.pt"), str(tmp / "peer_out.pt")], env, tmp)
    theirs = torch.load(tmp / "peer_out.pt", weights_only=True)
    model, _ = load_model(weights)
    out = {}
    with torch.no_grad():
        out["raw"] = (model(x)[0] - theirs["raw"]).abs().max().item()
        out["fused"] = (model.fuse()(x)[0] - theirs["fused"]).abs().max().item()
    return out


def yolov5_val(weights: Path, data_yaml: Path, imgsz: int, tmp: Path, env: dict) -> tuple[float, float]:
    log = peer(["-m", "yolov5.val", "--weights", str(weights), "--data", str(data_yaml), "--imgsz", str(imgsz),
                "--batch-size", "32", "--conf-thres", "0.001", "--iou-thres", "0.6", "--max-det", "300",
                "--device", "cpu", "--workers", "0", "--project", str(tmp / "val"), "--name", "y5", "--exist-ok"],
               env, tmp)
    m = VAL_LINE.findall(log)
    if not m:
        sys.exit(f"no 'all' line in YOLOv5 val output:\n{log[-3000:]}")
    return float(m[-1][4]), float(m[-1][5])


def first_val_map(run: Path) -> str:
    row = next(csv.DictReader(open(run / "results.csv")))
    return json.dumps({k.strip(): round(float(v), 4) for k, v in row.items() if "mAP" in k})


def absolute_data_yaml(data_yaml: Path, out: Path) -> Path:
    """A copy with `path` made absolute: YOLOv5 resolves a relative one against its working folder."""
    d = load_yaml(data_yaml, "data YAML")
    d["path"] = str((data_yaml.parent / (d.get("path") or ".")).resolve())
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


REPORT: list[str] = []


def say(line: str) -> None:
    """A report line: printed, and kept for --out (progress bars of the tools go to the terminal only)."""
    print(line, flush=True)
    REPORT.append(line)


def write_yolov5_files(ckpt: dict, tmp: Path, env: dict) -> dict[str, Path]:
    """Our weights in YOLOv5's own DetectionModel, saved by YOLOv5 in both layouts: {layout_kind: path}."""
    torch.save({"state": ckpt["model"], "yaml": ckpt["yaml"], "nc": ckpt["nc"], "names": ckpt["names"]}, tmp / "ours.pt")
    files = {}
    for layout in ("pip", "repo"):
        peer(["-c", PEER, "write", layout, str(tmp / "ours.pt"), str(tmp)], env, tmp)
        files |= {f"{layout}_{kind}": tmp / f"{layout}_{kind}.pt" for kind in ("best", "last")}
    globals_seen = sorted(set().union(*(torch.serialization.get_unsafe_globals_in_checkpoint(f) for f in files.values())))
    say(f"globals in the YOLOv5-written files: {', '.join(globals_seen)}")
    return files


def report_outputs(files: dict[str, Path], data: dict, a: argparse.Namespace, tmp: Path, env: dict) -> None:
    say("\n== equal outputs: YOLOv5 attempt_load vs our load_model (FP16 weights, FP32 compute), max |diff| of "
        "decoded predictions (pixels and scores)")
    x = probe_images(data, a.imgsz)
    worst = 0.0
    for name, f in files.items():
        d = compare_outputs(f, x, tmp, env)
        worst = max(worst, *d.values())
        say(f"{name:10s} {f.stat().st_size / 1e6:5.1f} MB  unfused {d['raw']:.3g}  fused {d['fused']:.3g}")
    if a.yolov5_trained:
        trained_data = load_data_config(absolute_data_yaml(Path(a.yolov5_trained_data or a.data), tmp / "trained.yaml"))
        d = compare_outputs(Path(a.yolov5_trained), probe_images(trained_data, a.imgsz), tmp, env)
        worst = max(worst, *d.values())
        say(f"trained by YOLOv5 ({Path(a.yolov5_trained).name}): unfused {d['raw']:.3g}  fused {d['fused']:.3g}")
    say(f"max |diff| over all: {worst:.3g} ({'PASS' if worst <= TOLERANCE_OUT else 'FAIL'}, target {TOLERANCE_OUT})")


def report_map(weights: Path, data_yaml: Path, a: argparse.Namespace, tmp: Path, env: dict):
    say(f"\n== mAP on {Path(a.data).name} at {a.imgsz} of {weights.name} (conf 0.001, IoU 0.6, max 300)")
    res = evaluator.run(data=str(data_yaml), weights=str(weights), imgsz=a.imgsz, batch_size=32, workers=0,
                        project=str(tmp / "val"), name="ours", plots=False)
    y50, y95 = yolov5_val(weights, data_yaml, a.imgsz, tmp, env)
    say(f"ours test.py     mAP@0.5 {res.map50:.4f}  mAP@0.5:0.95 {res.map:.4f}")
    say(f"YOLOv5 val.py    mAP@0.5 {y50:.4f}  mAP@0.5:0.95 {y95:.4f}")
    gap = max(abs(res.map50 - y50), abs(res.map - y95))
    say(f"largest gap {gap:.4f} ({'PASS' if gap <= TOLERANCE_MAP else 'FAIL'}, target {TOLERANCE_MAP})")
    return res


def report_finetuning(weights: Path, ours: dict, res, data_yaml: Path, a: argparse.Namespace, tmp: Path) -> None:
    def first_val(name: str, **start) -> str:
        out = train.run(data=str(data_yaml), epochs=a.finetune_epochs, imgsz=a.imgsz, batch_size=16, workers=0,
                        noplots=True, amp="off", project=str(tmp / name), **start)
        return first_val_map(out.save_dir)

    say(f"\n== fine-tuning: train.py --weights {weights.name} --epochs {a.finetune_epochs}")
    say(f"first validation, from the YOLOv5 file: {first_val('train', weights=str(weights))} (imported: mAP@0.5 "
        f"{res.map50:.4f}, mAP@0.5:0.95 {res.map:.4f})")
    say(f"first validation, same settings from our original checkpoint: {first_val('ours', weights=str(a.ckpt))}")
    hyp = load_yaml(REPO / "data" / "hyps" / "hyp.scratch.yaml", "hyp")
    hyp.update(lr0=1e-12, warmup_bias_lr=0.0, warmup_bias_lr_adam=0.0)  # weights stay; BN statistics still move
    (tmp / "still.yaml").write_text(yaml.safe_dump(hyp, sort_keys=False))
    say("first validation from the YOLOv5 file with learning rates 0: "
        f"{first_val('still', weights=str(weights), hyp=str(tmp / 'still.yaml'))}")
    cfg = tmp / "scratch.yaml"
    cfg.write_text(yaml.safe_dump(ours["yaml"], sort_keys=False))
    say(f"first validation, same settings from scratch: {first_val('scratch', cfg=str(cfg))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="one of our trained checkpoints")
    p.add_argument("--data", default=str(COCO128_DATA), help="the dataset it was trained for")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--yolov5-trained", default="", help="also compare a file YOLOv5 wrote while training")
    p.add_argument("--yolov5-trained-data", default="", help="the dataset of --yolov5-trained (default: --data)")
    p.add_argument("--finetune-epochs", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "yolov5_import.txt"),
                   help="append this run's report here ('' = print only)")
    a = p.parse_args()
    if not PEER_PY.is_file():
        sys.exit(f"{PEER_PY} not found: run ../shared/bench/peers.sh once to build the peer venv")
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="yolov5_import_"))
    env = peer_env(tmp / "cfg")
    data_yaml = absolute_data_yaml(Path(a.data), tmp / "data.yaml")
    say(f"torch {torch.__version__}, threads {torch.get_num_threads()}, our checkpoint {a.ckpt}, data {a.data}, "
        f"imgsz {a.imgsz}, work folder {tmp}")
    ours = load_checkpoint(a.ckpt)
    files = write_yolov5_files(ours, tmp, env)
    report_outputs(files, load_data_config(data_yaml), a, tmp, env)
    res = report_map(files["pip_best"], data_yaml, a, tmp, env)
    if a.finetune_epochs > 0:
        report_finetuning(files["pip_best"], ours, res, data_yaml, a, tmp)
    say(f"\ndone in {time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "a") as f:
            f.write(f"$ OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python bench/yolov5_import_check.py "
                    f"{' '.join(sys.argv[1:])}\n# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n" + "\n".join(REPORT) + "\n\n")


if __name__ == "__main__":
    main()
