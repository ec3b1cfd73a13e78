"""The training step's candidates for speed, one figure each: yolov5s, 640 px, batch 64 on one GPU.

    python bench/step_candidates.py [--cfg yolov5s.yaml] [--imgsz 640] [--batch 64] [--steps 20] [--device 0]
                                    [--candidates tf32 fp16-foreach fp16 fp16-graphs fp16-compile] [--json OUT]

Each candidate is train.py's step (ComputeLoss in FP32, utils.engine.updater.AmpUpdater: scaled backward, unscale,
clip, AdamW, scaler update, EMA update) on a fresh yolov5s (seed 0), channels_last, on one fixed batch, with one
change:

  tf32          FP32 arithmetic with TF32 matmuls and convolutions (the baseline of the issue's fp16 >= 2x goal)
  fp16-foreach  fp16 autocast + GradScaler, AdamW's multi-tensor (foreach) kernels: before fused optimizers
  fp16          the same with AdamW(fused=True): train.py's step on CUDA
  fp16-graphs   fp16 with the model's forward and backward replayed from CUDA graphs (torch.cuda.
                make_graphed_callables; the shapes are fixed), the loss and the update as before
  fp16-compile  fp16 with torch.compile(model) (--compile-backend, default inductor); its compile time is reported

Reported: images/s over --steps timed steps after --warmup ones (the GPU synchronised at both ends), against tf32
and fp16, and peak memory (CUDA). A candidate that fails reports its error in one line and the others go on. On a
CPU (--device cpu, the tests' tiny settings) CUDA-only candidates report "needs CUDA".
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.yolo import Model  # noqa: E402
from utils.data.data_config import load_hyp  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.engine.amp import Precision  # noqa: E402
from utils.engine.ema import ModelEMA  # noqa: E402
from utils.engine.loss import ComputeLoss, loss_gains  # noqa: E402
from utils.engine.optim import build_optimizer  # noqa: E402
from utils.engine.updater import AmpUpdater  # noqa: E402

CANDIDATES = ("tf32", "fp16-foreach", "fp16", "fp16-graphs", "fp16-compile")
CUDA_ONLY = ("tf32", "fp16-graphs")
NC = 80


@contextmanager
def tf32(on: bool):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def batch(dev: torch.device, size: int, imgsz: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(size, 3, imgsz, imgsz, device=dev, generator=g).contiguous(memory_format=torch.channels_last)
    n = size * 6
    t = torch.cat((torch.arange(n, device=dev).remainder(size)[:, None].float(),
                   torch.randint(0, NC, (n, 1), device=dev, generator=g).float(),
                   0.2 + 0.6 * torch.rand(n, 2, device=dev, generator=g),
                   0.05 + 0.3 * torch.rand(n, 2, device=dev, generator=g)), 1)
    return x, t


def measure(name: str, cfg: str, imgsz: int, size: int, steps: int, warmup: int, dev: torch.device,
            backend: str = "inductor") -> dict:
    """One candidate's images/s (and peak GiB on CUDA)."""
    if name in CUDA_ONLY and dev.type != "cuda":
        return {"candidate": name, "skipped": "needs CUDA"}
    torch.manual_seed(0)
    model = Model(cfg, nc=NC).to(dev, memory_format=torch.channels_last).train()
    prec = Precision("off" if name == "tf32" else "fp16", dev.type)
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, NC, imgsz))
    optimizer = build_optimizer(model, "AdamW", 0.001, 0.9, 5e-4, fused=name != "fp16-foreach")
    updater = AmpUpdater(model, optimizer, prec, ModelEMA(model))
    x, t = batch(dev, size, imgsz)
    forward, autocast, compile_s = model, prec.autocast, None
    if name == "fp16-graphs":
        # autocast's weight cache cannot live across graph replays (PyTorch's rule for graphed callables)
        def autocast():
            return torch.autocast(dev.type, dtype=torch.float16, cache_enabled=False)

        with autocast():
            forward = torch.cuda.make_graphed_callables(model, (x,))
    elif name == "fp16-compile":
        forward = torch.compile(model, backend=backend)

    def step() -> None:
        with autocast():
            loss, _ = loss_fn(forward(x), t)
        updater.backward(loss)
        updater.step()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with tf32(name == "tf32"):
        t0 = time.perf_counter()
        step()  # the first: cuDNN's choices, the compilation
        sync()
        if name == "fp16-compile":
            compile_s = time.perf_counter() - t0
        for _ in range(max(warmup - 1, 0)):
            step()
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        seconds = time.perf_counter() - t0
    row = {"candidate": name, "img/s": steps * size / seconds, "skipped_steps": updater.skipped}
    if dev.type == "cuda":
        row["peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
    if compile_s is not None:
        row["compile s"] = compile_s
    return row


def table(rows: list[dict], header: str) -> str:
    by = {r["candidate"]: r for r in rows}
    base = {k: by[k]["img/s"] for k in ("tf32", "fp16") if "img/s" in by.get(k, {})}
    lines = [header, f"{'candidate':<14} {'images/s':>9} {'x tf32':>7} {'x fp16':>7} {'peak GiB':>9}  note"]
    for r in rows:
        if "img/s" not in r:
            note = r.get("skipped") or r.get("error")
            lines.append(f"{r['candidate']:<14} {'-':>9} {'-':>7} {'-':>7} {'-':>9}  {note}")
            continue
        ratio = lambda k: f"{r['img/s'] / base[k]:.2f}" if k in base else "-"  # noqa: E731
        note = f"compiled in {r['compile s']:.0f} s" if "compile s" in r else ""
        mem = f"{r['peak GiB']:.1f}" if "peak GiB" in r else "-"
        lines.append(f"{r['candidate']:<14} {r['img/s']:>9.1f} {ratio('tf32'):>7} {ratio('fp16'):>7} {mem:>9}  {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cfg", default="yolov5s.yaml")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="0")
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (the tests use eager)")
    p.add_argument("--json", default="", help="also write the rows to this file (bench/gpu_goals.py reads it)")
    a = p.parse_args(argv)
    dev = select_device(a.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    rows = []
    for name in a.candidates:
        try:
            rows.append(measure(name, a.cfg, a.imgsz, a.batch, a.steps, a.warmup, dev, a.compile_backend))
        except Exception as e:  # one candidate's failure is its row's figure; the others still run
            rows.append({"candidate": name, "error": f"failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"})
        gc.collect()  # a graphed or compiled model holds its memory pool until it is collected
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
        if a.json:  # after each candidate: a time limit that stops the script keeps what was measured
            Path(a.json).write_text(json.dumps(rows, indent=1))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(table(rows, f"{a.cfg} {a.imgsz} px batch {a.batch}, {a.steps} timed steps after {a.warmup}, {name}"))


if __name__ == "__main__":
    main()
