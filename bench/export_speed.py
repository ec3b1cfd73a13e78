"""detect.py end to end with an exported ONNX file (ONNX Runtime) against our PyTorch path, in one run.

    OMP_NUM_THREADS=1 python bench/export_speed.py                 # yolov5s FP32, COCO128 at 640, 1 thread
    python bench/export_speed.py --threads 2 --rounds 3 --out bench/results/export_speed.txt

Both backends run the same detect.detect() over the same images (same letterbox, NMS and file writing), with
the same thread count: torch.set_num_threads(n), and ONNX Runtime takes torch.get_num_threads()
(utils/interop/backends.py). The rounds alternate the backends (A B A B ...), so load on a shared machine hits both
alike; the ratio is of the medians. Weights are random (seed 0): speed does not depend on them except through
NMS. BatchNorm statistics are measured on random pictures first, so activations have realistic magnitudes; the
head's weights are then zeroed (--head prior) so it predicts its initial priors and few boxes pass --conf-thres
0.25, as with a trained model; --head random keeps them, and thousands of candidates per image make NMS heavy.

Reported per backend: end-to-end ms per image (wall time of detect() over all images, including model load,
reading the pictures and saving the annotated ones, divided by the image count), the same in CPU time of this
process (time.process_time: with one thread it is the steadier number when other jobs share the cores), and
detect's own per-stage timers (wall).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import detect  # noqa: E402
import export  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.engine.checkpoint import atomic_save, make_checkpoint  # noqa: E402
from utils.files import REPO_ROOT  # noqa: E402

COCO128 = REPO_ROOT.parent / "shared" / "datasets" / "coco128" / "images" / "train2017"
OUT = REPO_ROOT / "bench" / "out" / "export_speed"


def checkpoint(cfg: str, folder: Path, nc: int = 80, head: str = "prior") -> Path:
    torch.manual_seed(0)
    model = Model(cfg, nc=nc)
    # BatchNorm statistics measured on random pictures: at their initial values activations fade towards 0
    # layer by layer, and tiny (let alone subnormal) floats can run at a different speed than trained ones
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.rand(2, 3, 256, 256))
        if head == "prior":  # the head predicts its initial priors: few boxes, as a trained model at conf 0.25
            for conv in model.model[-1].m:
                conv.weight.zero_()
    model.eval()
    path = folder / f"{Path(cfg).stem}_random.pt"
    atomic_save(make_checkpoint(model, model.yaml, [f"class{i}" for i in range(nc)], epoch=0), path)
    return path


def one_run(weights: Path, source: Path, imgsz: int, name: str) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    r = detect.detect(detect.DetectOptions(weights=str(weights), source=str(source), imgsz=imgsz, device="cpu",
                                           project=str(OUT / "runs"), name=name, exist_ok=True))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"e2e": wall / r.seen * 1e3, "cpu": cpu / r.seen * 1e3, **{k: v for k, v in r.speed.items()}, "n": r.seen}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5s.yaml")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads for both backends")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per backend")
    p.add_argument("--source", default=str(COCO128))
    p.add_argument("--out", default=None, help="also write the report to this file")
    p.add_argument("--head", choices=("prior", "random"), default="prior",
                   help="prior: head weights zeroed, few boxes (NMS at its floor, as for a trained model); random: "
                        "thousands of candidates per image, NMS's heavy case")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    pt = checkpoint(args.cfg, OUT, head=args.head)
    t0 = time.perf_counter()
    onnx_path = export.run(pt, include=("onnx",), imgsz=args.imgsz, dynamic=True, device="cpu")[0]
    export_s = time.perf_counter() - t0
    source = Path(args.source)
    first = sorted(source.glob("*.jpg"))[:2]
    for w in (pt, onnx_path):  # warm-up: page cache, allocator, ORT's first session
        detect.detect(detect.DetectOptions(weights=str(w), source=str(first[0]), imgsz=args.imgsz, device="cpu",
                                           project=str(OUT / "runs"), name="warmup", exist_ok=True, nosave=True))
    runs: dict[str, list[dict]] = {"pytorch": [], "onnxruntime": []}
    for i in range(args.rounds):
        order = (("pytorch", pt), ("onnxruntime", onnx_path)) if i % 2 == 0 else (("onnxruntime", onnx_path), ("pytorch", pt))
        for label, w in order:
            runs[label].append(one_run(w, source, args.imgsz, label))
            r = runs[label][-1]
            print(f"round {i + 1} {label:12s} {r['e2e']:.1f} ms/image end to end (CPU time {r['cpu']:.1f})", flush=True)
    lines = [f"bench/export_speed.py: {Path(args.cfg).stem} FP32 random weights, detect.py over {runs['pytorch'][0]['n']} "
             f"images of {source} at --imgsz {args.imgsz}, batch 1, CPU, {args.threads} thread(s) for both backends "
             f"(torch {torch.__version__}, onnxruntime {_ort_version()}), --head {args.head}, {args.rounds} alternating rounds, "
             f"ONNX --dynamic export took {export_s:.1f} s",
             f"{'backend':12s} {'e2e ms/img':>11s} {'e2e CPU ms':>11s} {'pre ms':>8s} {'infer ms':>9s} {'NMS ms':>8s}"
             f"   (medians; wall e2e per round)"]
    med = {}
    for label, rs in runs.items():
        med[label] = {k: statistics.median(r[k] for r in rs) for k in ("e2e", "cpu", "pre-process", "inference", "NMS")}
        m = med[label]
        lines.append(f"{label:12s} {m['e2e']:11.1f} {m['cpu']:11.1f} {m['pre-process']:8.1f} {m['inference']:9.1f} "
                     f"{m['NMS']:8.1f}   (" + ", ".join(f"{r['e2e']:.1f}" for r in rs) + ")")
    pt_, ox = med["pytorch"], med["onnxruntime"]
    lines.append(f"ratio PyTorch / ONNX Runtime: end to end {pt_['e2e'] / ox['e2e']:.2f}x wall, "
                 f"{pt_['cpu'] / ox['cpu']:.2f}x CPU time; inference stage alone {pt_['inference'] / ox['inference']:.2f}x")
    lines.append("(wall: what a user waits, moved by other jobs on a shared machine; CPU time: this process's own work, "
                 "with one thread the steadier measure of the same thing)")
    report = "\n".join(lines)
    publish(report, args.out)


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def publish(report: str, out: str | None) -> None:
    """Print a bench report and, with --out, keep it as a raw-results file (the export benches share this)."""
    print(report)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report + "\n")


if __name__ == "__main__":
    main()
