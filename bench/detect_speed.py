"""How fast detect.py runs: images per second over COCO128 at 640, split into pre-process, inference, NMS.

    python bench/detect_speed.py                       # CPU: detect.run over the 128 COCO128 images
    python bench/detect_speed.py --weights best.pt     # a trained checkpoint instead of an untrained one
    python bench/detect_speed.py --gpu                 # CUDA: FP16 vs FP32 latency at batch 1 and 32

Weights barely change speed (the same convolutions run either way); only NMS depends on how many boxes
pass --conf-thres, so an untrained yolov5s (few boxes) shows NMS's floor, and --conf-thres 0.001 its
heavier validation-style load.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import detect  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.data.data_config import SHARED_COCO128  # noqa: E402
from utils.engine.amp import prepare_inference  # noqa: E402
from utils.engine.checkpoint import atomic_save, make_checkpoint  # noqa: E402

COCO128 = SHARED_COCO128 / "images" / "train2017"


def untrained_checkpoint(cfg: str, folder: Path, nc: int = 80) -> Path:
    torch.manual_seed(0)
    model = Model(cfg, nc=nc)
    path = folder / f"{Path(cfg).stem}_untrained.pt"
    atomic_save(make_checkpoint(model, model.yaml, [f"class{i}" for i in range(nc)], epoch=0), path)
    return path


def detect_rows(weights: Path, source: Path, imgsz: int, conf: float, device: str, tmp: Path) -> list[tuple]:
    """One row per mode: (mode, images, wall s, images/s, pre ms, inference ms, NMS ms)."""
    base = dict(weights=str(weights), source=str(source), imgsz=imgsz, conf_thres=conf, device=device,
                project=str(tmp / "runs"), exist_ok=True)
    # warm-up: the first forward pays for allocator and kernel set-up, which a long run amortises
    first = str(sorted(source.glob("*.jpg"))[0])
    detect.detect(detect.DetectOptions(**{**base, "source": first, "name": "warmup", "nosave": True}))
    rows = []
    for label, nosave in (("save images", False), ("--nosave", True)):
        t0 = time.perf_counter()
        r = detect.detect(detect.DetectOptions(**{**base, "name": label.strip("-").replace(" ", "_"), "nosave": nosave}))
        wall = time.perf_counter() - t0
        s = r.speed
        rows.append((label, r.seen, wall, r.seen / wall, s["pre-process"], s["inference"], s["NMS"]))
    return rows


def print_table(header: tuple[str, ...], rows: list[tuple]) -> None:
    widths = [max(len(h), 10) for h in header]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        cells = [v if isinstance(v, str) else f"{v:.1f}" if isinstance(v, float) else str(v) for v in row]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


def cpu_mode(args: argparse.Namespace) -> None:
    source = Path(args.source)
    if not source.is_dir():
        sys.exit(f"error: {source} not found; pass --source with a folder of images (e.g. COCO128's train2017)")
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(args.weights) if args.weights else untrained_checkpoint(args.cfg, Path(tmp))
        rows = detect_rows(weights, source, args.imgsz, args.conf_thres, args.device or "cpu", Path(tmp))
    threads = torch.get_num_threads()
    print(f"\ndetect.py on {source} at {args.imgsz}, {weights.name if args.weights else args.cfg + ' (untrained)'}, "
          f"conf {args.conf_thres}, {threads} CPU threads; ms are per image")
    print_table(("mode", "images", "wall s", "img/s", "pre ms", "infer ms", "NMS ms"), rows)


@torch.inference_mode()
def latency(model: torch.nn.Module, batch: int, imgsz: int, dtype: torch.dtype, budget_s: float = 4.0) -> float:
    """Median ms per forward pass of a (batch, 3, imgsz, imgsz) input, after warm-up."""
    x = torch.rand(batch, 3, imgsz, imgsz, device="cuda").to(dtype)
    for _ in range(5):
        model(x)
    times = []
    end = time.perf_counter() + budget_s
    while len(times) < 10 or (time.perf_counter() < end and len(times) < 200):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def gpu_mode(args: argparse.Namespace) -> None:
    """FP16 vs FP32 latency of the fused model at batch 1 and 32 (model only), then detect.run at both."""
    if not torch.cuda.is_available():
        print("--gpu: no CUDA device here; nothing measured")
        return
    torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest kernels
    name = torch.cuda.get_device_name(0)
    rows = []
    for dtype, label in ((torch.float32, "FP32"), (torch.float16, "FP16")):
        model = prepare_inference(Model(args.cfg, nc=80).fuse(), "cuda:0", dtype)
        for b in (1, 32):
            ms = latency(model, b, args.imgsz, dtype)
            rows.append((label, b, ms, ms / b, 1e3 * b / ms))
        del model
        torch.cuda.empty_cache()
    print(f"\n{args.cfg} at {args.imgsz} on {name}: forward pass of the fused model (median)")
    print_table(("dtype", "batch", "ms/batch", "ms/image", "img/s"), rows)
    if Path(args.source).is_dir():
        gpu_detect_rows(args)


def gpu_detect_rows(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(args.weights) if args.weights else untrained_checkpoint(args.cfg, Path(tmp))
        for half, label in ((False, "FP32"), (True, "FP16")):
            for b in (1, 32):
                opts = detect.DetectOptions(weights=str(weights), source=args.source, imgsz=args.imgsz, device="0",
                                            half=half, batch_size=b, nosave=True, project=str(Path(tmp) / "runs"),
                                            conf_thres=args.conf_thres)
                detect.detect(opts)  # warm-up pass over the folder
                t0 = time.perf_counter()
                r = detect.detect(opts)
                wall = time.perf_counter() - t0
                s = r.speed
                rows.append((label, b, r.seen / wall, s["pre-process"], s["inference"], s["NMS"]))
    print(f"\ndetect.run --nosave over {args.source} (ms per image)")
    print_table(("dtype", "batch", "img/s", "pre ms", "infer ms", "NMS ms"), rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default="", help="checkpoint (default: an untrained --cfg model)")
    p.add_argument("--cfg", default="yolov5s.yaml")
    p.add_argument("--source", default=str(COCO128))
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--conf-thres", type=float, default=0.25)
    p.add_argument("--device", default="", help="device for the CPU table (default cpu)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--gpu", action="store_true", help="FP16 vs FP32 on CUDA instead of the CPU table")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # per-image lines would drown the table
    gpu_mode(args) if args.gpu else cpu_mode(args)


if __name__ == "__main__":
    main()
