"""detect.py beside YOLOv5 7.0.14's detect.py: the same yolov5s weights, the same images, both processes
timed end to end (start-up, model load, every image, saving the annotated images: each tool's defaults).

    bash ../shared/bench/peers.sh ...        # once: builds the peer venv (/tmp/peer-venv)
    python bench/detect_vs_yolov5.py         # COCO128's 128 images at 640, 2 rounds, alternating

The weights: an untrained yolov5s of ours (seed 0) is copied tensor by tensor into YOLOv5's own Model
(the state-dict keys are the same), and both networks are run on one input first: if their outputs
differ the comparison is refused. Each process's own "Speed:" line gives the per-image split.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.detect_speed import COCO128, untrained_checkpoint  # noqa: E402
from models.yolo import load_model  # noqa: E402
from utils.files import REPO_ROOT  # noqa: E402

PEER_PY = Path("/tmp/peer-venv/bin/python")
PEER_CFG = Path("/tmp/peer-runs/cfg/y5")  # peers.sh puts the fonts YOLOv5 would otherwise download here
SPEED = re.compile(r"Speed: ([\d.]+)ms pre-process, ([\d.]+)ms inference, ([\d.]+)ms NMS")

# runs in the peer venv: YOLOv5's Model with our tensors, saved the way YOLOv5 saves (a pickled FP16
# module), plus its output on the probe input for the equality check
TO_YOLOV5 = """
import sys, torch
import yolov5, os
sys.path.insert(0, os.path.dirname(yolov5.__file__))
from models.yolo import Model
sd_path, cfg, out, probe = sys.argv[1:5]
m = Model(cfg, ch=3, nc=80)
m.load_state_dict(torch.load(sd_path), strict=True)
m.names = {i: f"class{i}" for i in range(80)}
with torch.no_grad():
    y = m.eval()(torch.load(probe))[0]
torch.save(y, out + ".probe_out")
torch.save({"model": m.half(), "epoch": -1}, out)
"""


def peer_env() -> dict:
    return {**os.environ, "YOLOV5_CONFIG_DIR": str(PEER_CFG), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
            "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled", "COMET_MODE": "disabled", "CLEARML_OFF": "1"}


def make_weights(tmp: Path) -> tuple[Path, Path]:
    """(our checkpoint, YOLOv5's checkpoint) holding the same untrained yolov5s."""
    ours = untrained_checkpoint("yolov5s.yaml", tmp)
    model, _ = load_model(ours, "cpu")
    model = model.float().eval()
    torch.save(model.state_dict(), tmp / "state_dict.pt")
    probe = torch.rand(1, 3, 256, 320, generator=torch.Generator().manual_seed(0))
    torch.save(probe, tmp / "probe.pt")
    theirs = tmp / "yolov5s_peer.pt"
    subprocess.run([str(PEER_PY), "-c", TO_YOLOV5, str(tmp / "state_dict.pt"), str(REPO_ROOT / "models" / "yolov5s.yaml"),
                    str(theirs), str(tmp / "probe.pt")], check=True, env=peer_env(), cwd=tmp)
    with torch.no_grad():
        diff = (model(probe)[0] - torch.load(str(theirs) + ".probe_out")).abs().max().item()
    print(f"same network check: max |our output - YOLOv5's| = {diff:.2e} on one 256x320 input")
    if diff > 1e-3:
        sys.exit("the two networks disagree; the comparison would not be like for like")
    return ours, theirs


def timed(cmd: list[str], env: dict | None, cwd: Path) -> tuple[float, tuple[float, ...]]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"{cmd[0]} failed:\n{p.stderr[-2000:]}")
    m = SPEED.findall(p.stdout + p.stderr)
    return wall, tuple(float(x) for x in m[-1]) if m else (float("nan"),) * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=str(COCO128))
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    source = Path(args.source)
    if not PEER_PY.exists():
        sys.exit(f"{PEER_PY} not found: run ../shared/bench/peers.sh once to build the peer venv")
    if not source.is_dir():
        sys.exit(f"{source} not found; pass --source with a folder of images")
    n = len([p for p in source.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png")])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ours, theirs = make_weights(tmp)
        commands = {
            "ours": ([sys.executable, str(REPO_ROOT / "detect.py"), "--weights", str(ours), "--source", str(source),
                      "--imgsz", str(args.imgsz), "--project", str(tmp / "ours")], None),
            "YOLOv5": ([str(PEER_PY), "-m", "yolov5.detect", "--weights", str(theirs), "--source", str(source),
                        "--imgsz", str(args.imgsz), "--device", "cpu", "--project", str(tmp / "yolov5")], peer_env()),
        }
        results: dict[str, list] = {k: [] for k in commands}
        for _ in range(args.rounds):
            for name, (cmd, env) in commands.items():
                results[name].append(timed(cmd, env, tmp))
    print(f"\n{n} images from {source} at {args.imgsz}, yolov5s (same weights), FP32, each tool's defaults "
          f"(annotated images saved), {torch.get_num_threads()} CPU threads; best of {args.rounds} rounds")
    print(f"{'':8} {'wall s':>8} {'img/s':>8} {'pre ms':>8} {'infer ms':>9} {'NMS ms':>8}")
    best = {}
    for name, runs in results.items():
        wall, (pre, inf, nms) = min(runs, key=lambda r: r[0])
        best[name] = n / wall
        print(f"{name:8} {wall:8.1f} {n / wall:8.2f} {pre:8.1f} {inf:9.1f} {nms:8.1f}")
    print(f"ours / YOLOv5, end-to-end images/s: {best['ours'] / best['YOLOv5']:.2f}x")


if __name__ == "__main__":
    main()
