"""How far autocast's gradients are from FP32's, step by step along a real training run.

    python bench/grad_fidelity.py --data bench/out/paste10n/paste10n.yaml --imgsz 256 \\
        --steps 0 5 10 20 38 76 152 --out bench/results/grad_fidelity_paste10n.csv
    python bench/grad_fidelity.py --modes off bf16 bf16-weights --out bench/results/grad_fidelity_shapes.csv
                                                   # the built-in shapes dataset, 192 px
    python bench/grad_fidelity.py --data bench/out/paste8/paste8.yaml --imgsz 256 --epochs 25 \
        --steps 0 10 100 200 400 600 --modes bf16 bf16-head32 --out bench/results/grad_fidelity_paste8_head32.csv

It trains in FP32 with the default recipe (train.py itself, through its callbacks) and, at each listed
optimizer batch, takes the gradient of one fixed batch (the run's first) in FP32 and under each autocast
mode, from the same weights ("bf16-weights": FP32 arithmetic on the weights rounded to bf16, which tells
how sensitive the gradient itself is at that point; "bf16-head32": bf16 with the Detect layer's convs in
FP32, whether the rounded head output matters). Per mode it reports the cosine between the two
gradients of every parameter tensor (mean, the backbone's mean, 10th percentile), the median relative
error |g_amp - g_fp32| / |g_fp32|, and the norm of the backbone's FP32 gradient. "off" recomputes FP32
and must give cosine 1: the measurement itself changes nothing (BatchNorm statistics and accumulated
gradients are put back afterwards).

This is what utils/engine/amp.BF16_FP32_WARMUP rests on. fp16 on a CPU is emulated: about 8x the FP32 time.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import train  # noqa: E402
from utils.engine.amp import Precision  # noqa: E402
from utils.engine.callbacks import Callbacks  # noqa: E402
from utils.engine.dist import de_parallel  # noqa: E402

FIELDS = ("step", "mode", "mean_cos", "backbone_mean_cos", "p10_cos", "median_rel_err", "backbone_grad_norm")


class _Done(Exception):
    """Raised from the callback after the last listed step: the rest of the schedule is not needed."""


def batch_gradients(model: nn.Module, compute_loss, imgs: torch.Tensor, targets: torch.Tensor,
                    precision: Precision) -> dict[str, torch.Tensor]:
    """The gradient of one batch's loss for every trainable parameter, with the forward under `precision`.
    The model's accumulated gradients and BatchNorm statistics are left as they were."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    held = {k: p.grad for k, p in params.items()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    for p in params.values():
        p.grad = None
    with precision.autocast():
        loss, _ = compute_loss(model(imgs), targets)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in params.items() if p.grad is not None}
    for k, p in params.items():
        p.grad = held[k]
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(buffers[k])
    return grads


def rounded_weights_gradients(model: nn.Module, compute_loss, imgs: torch.Tensor,
                              targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The FP32 gradient from the weights rounded to bf16 (then put back): rounding without bf16 arithmetic."""
    held = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    try:
        return batch_gradients(model, compute_loss, imgs, targets, Precision("off", "cpu"))
    finally:
        with torch.no_grad():
            for p, h in zip(model.parameters(), held):
                p.copy_(h)


@contextlib.contextmanager
def fp32_head(model: nn.Module):
    """The Detect layer's 1x1 convs compute in FP32 under autocast (then put back): does rounding the head's
    output, the loss's input, matter? Each conv's forward is swapped on the instance, so names stay."""
    convs = list(model.model[-1].m)
    for c in convs:
        def forward(x: torch.Tensor, conv: nn.Conv2d = c) -> torch.Tensor:
            with torch.autocast(x.device.type, enabled=False):
                return type(conv).forward(conv, x.float())
        c.forward = forward
    try:
        yield
    finally:
        for c in convs:
            del c.forward


def compare(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], backbone: int) -> dict[str, float]:
    """Agreement of two gradients, parameter tensor by tensor; `backbone`: layers model.0 .. model.{backbone-1}."""
    cos, rel, bb_cos, bb_sq = [], [], [], 0.0
    for k, a in ref.items():
        a, b = a.flatten().double(), got[k].flatten().double()
        c = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
        cos.append(c)
        rel.append(((b - a).norm() / a.norm().clamp(min=1e-30)).item())
        if int(k.split(".")[1]) < backbone:
            bb_cos.append(c)
            bb_sq += float(a.square().sum())
    return {"mean_cos": statistics.fmean(cos), "backbone_mean_cos": statistics.fmean(bb_cos),
            "p10_cos": sorted(cos)[len(cos) // 10], "median_rel_err": statistics.median(rel),
            "backbone_grad_norm": bb_sq ** 0.5}


def measure(argv_train: list[str], steps: list[int], modes: list[str]) -> list[dict]:
    rows: list[dict] = []
    fixed: dict[str, torch.Tensor] = {}

    def on_batch(t, ni, imgs, targets, paths):
        if ni == 0:
            fixed.update(imgs=imgs.clone(), targets=targets.to(imgs.device).clone())
        if ni in steps:
            model = de_parallel(t.model)
            backbone = len(model.yaml["backbone"])
            ref = batch_gradients(model, t.compute_loss, fixed["imgs"], fixed["targets"], Precision("off", "cpu"))
            for mode in modes:
                if mode == "bf16-weights":
                    got = rounded_weights_gradients(model, t.compute_loss, fixed["imgs"], fixed["targets"])
                else:
                    with fp32_head(model) if mode == "bf16-head32" else contextlib.nullcontext():
                        got = batch_gradients(model, t.compute_loss, fixed["imgs"], fixed["targets"],
                                              Precision(mode.removesuffix("-head32"), fixed["imgs"].device.type))
                row = {"step": ni, "mode": mode, **compare(ref, got, backbone)}
                rows.append(row)
                print(f"step {ni:5d} {mode:4s} " + " ".join(f"{k} {row[k]:.4g}" for k in FIELDS[2:]), flush=True)
        if ni >= max(steps):
            raise _Done

    cb = Callbacks()
    cb.register("on_train_batch", on_batch)
    try:
        train.train(train.parse_opt(argv_train), cb)
    except _Done:
        pass
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "data" / "shapes.yaml"))
    p.add_argument("--cfg", default="yolov5n.yaml")
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=30, help="the schedule the measured run follows (it stops early)")
    p.add_argument("--steps", nargs="+", type=int, default=[0, 5, 10, 20, 40, 80, 160])
    p.add_argument("--modes", nargs="+", default=["off", "bf16", "fp16"],
                   choices=["off", "bf16", "fp16", "bf16-weights", "bf16-head32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--project", default=str(ROOT / "bench" / "out" / "grad_fidelity"))
    p.add_argument("--out", default=None, help="CSV of the rows (default: none)")
    a = p.parse_args(argv)
    rows = measure(["--data", a.data, "--cfg", a.cfg, "--imgsz", str(a.imgsz), "--batch-size", str(a.batch_size),
                    "--epochs", str(a.epochs), "--seed", str(a.seed), "--workers", str(a.workers), "--amp", "off",
                    "--device", "cpu", "--noval", "--noplots", "--project", a.project, "--exist-ok"],
                   sorted(set(a.steps)), a.modes)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
