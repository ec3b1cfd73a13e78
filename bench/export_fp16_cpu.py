"""FP16 against FP32 ONNX on ONNX Runtime's CPU provider: does the FP16 graph load, how fast, how close.

    OMP_NUM_THREADS=1 python bench/export_fp16_cpu.py --weights best.pt --imgsz 320

The measurement behind export.py's CPU-only --half decision (its module notes). Exports both graphs (--dynamic)
into bench/out/export_fp16_cpu/, then times session.run on one letterboxed-size input in CPU time
(time.process_time, one thread: steady on a shared machine), alternating the two graphs, median of --runs each.
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
from bench.export_speed import publish  # noqa: E402

import export  # noqa: E402
from models.yolo import load_for_inference  # noqa: E402
from utils.files import REPO_ROOT  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "export_fp16_cpu"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", required=True)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    cpu = torch.device("cpu")
    f32 = export.run(args.weights, ("onnx",), args.imgsz, dynamic=True, device="cpu", output_dir=OUT / "fp32")[0]
    f16 = export.run(args.weights, ("onnx",), args.imgsz, half=True, dynamic=True, device="cpu", output_dir=OUT / "fp16")[0]
    b32, b16 = load_for_inference(f32, cpu), load_for_inference(f16, cpu)
    pt = load_for_inference(args.weights, cpu, half=False)
    x = torch.rand(1, 3, args.imgsz, args.imgsz, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref, o32, o16 = pt.predict(x), b32.predict(x), b16.predict(x)
    times: dict[str, list[float]] = {"fp32": [], "fp16": []}
    for _ in range(args.runs):
        for label, b in (("fp32", b32), ("fp16", b16)):
            t = time.process_time()
            b.predict(x)
            times[label].append((time.process_time() - t) * 1e3)
    m32, m16 = statistics.median(times["fp32"]), statistics.median(times["fp16"])

    def err(o: torch.Tensor) -> str:
        box = (o[..., :4] - ref[..., :4]).abs().max().item()
        score = (o[..., 4:] - ref[..., 4:]).abs().max().item()
        return f"boxes within {box:.3f} px, scores within {score:.1e} of PyTorch FP32"

    lines = [f"bench/export_fp16_cpu.py: {args.weights} at {args.imgsz} px, batch 1, ONNX Runtime CPU provider, 1 thread, "
             f"CPU time, median of {args.runs} alternating runs",
             f"fp32 graph: loads, {m32:.1f} ms, {err(o32)}, file {f32.stat().st_size / 1e6:.1f} MB",
             f"fp16 graph: loads, {m16:.1f} ms, {err(o16)}, file {f16.stat().st_size / 1e6:.1f} MB",
             f"fp16 speed / fp32 speed: {m32 / m16:.2f}x"]
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
