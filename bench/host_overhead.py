"""Host work per training step, measured where compute is negligible: what bounds the loop on a fast GPU.

    python bench/host_overhead.py                       # yolov5n, 64 px, batch 16, the built-in dataset, CPU
    python bench/host_overhead.py --repo ../other/checkout   # the same measurement of another checkout's train.py

One in-process run of train.py (cached images, 0 workers, FP32, one thread: host work is serial) with callbacks around each training step
(on_train_batch to on_step_end, optimizer step included). Per step it reports:
- host reads: calls in the project's own code that copy a tensor's value to the host (item, tolist,
  __bool__/__float__/__int__, cpu, numpy). On a GPU each one waits for every queued kernel: the host cannot run
  ahead of the GPU. (PyTorch's own reads of CPU-side counters, such as Adam's step count, are not counted: on
  a GPU they are no synchronisation.)
- operators: top-level ATen operators dispatched (torch.profiler over a few steps); each costs host time on
  any device.
- ms: wall time of the step on this CPU at a size where the convolutions are cheap.
Printed as one table; compare checkouts within one run of this script on one machine (ratios).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path


def measure(repo: Path, imgsz: int, batch: int, epochs: int, profile_steps: int = 5, fused: bool = False) -> dict:
    sys.path.insert(0, str(repo))
    import collections

    import torch

    import train
    if fused:  # what train.py does on CUDA: the fused optimizer, and with it the update without host reads
        build = train.build_optimizer
        train.build_optimizer = lambda *a, **k: build(*a, **{**k, "fused": True})
    from utils.engine.callbacks import Callbacks

    torch.set_num_threads(1)
    reads = {"n": 0, "on": False}
    ours = (str(repo) + "/", )
    names = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
    originals = {n: getattr(torch.Tensor, n) for n in names}

    def counting(name):
        orig = originals[name]

        def wrapper(self, *a, **k):
            if reads["on"] and sys._getframe(1).f_code.co_filename.startswith(ours):
                reads["n"] += 1
            return orig(self, *a, **k)
        return wrapper

    spans, marks, ops = [], {}, {"n": 0, "steps": 0}
    prof = {"p": None}

    def start(t, ni, *args):
        marks["t0"] = time.perf_counter()
        reads["on"] = True
        if ni == 5 and prof["p"] is None:  # after the first steps (allocations, kernel choice)
            prof["p"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof["p"].__enter__()

    def end(t, ni, *args):
        reads["on"] = False
        spans.append(time.perf_counter() - marks["t0"])
        p = prof["p"]
        if p is not None and ops["steps"] < profile_steps:
            ops["steps"] += 1
            if ops["steps"] == profile_steps:
                p.__exit__(None, None, None)
                top = [e.name for e in p.events() if e.cpu_parent is None and e.name.startswith("aten::")]
                ops["n"], ops["names"] = len(top), collections.Counter(top).most_common(8)

    cb = Callbacks()
    cb.register("on_train_batch", start)
    cb.register("on_step_end", end)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        for n in names:
            stack.callback(setattr, torch.Tensor, n, originals[n])
            setattr(torch.Tensor, n, counting(n))
        train.run(imgsz=imgsz, batch_size=batch, epochs=epochs, workers=0, cache="ram", amp="off", noval=True,
                  noplots=True, project=tmp, callbacks=cb, device="cpu")
    steady = spans[len(spans) // 4:]
    return {"ms": 1000 * sorted(steady)[len(steady) // 2], "reads": reads["n"] / len(spans),
            "ops": ops["n"] / max(ops["steps"], 1), "steps": len(spans),
            "top": [(n, c / max(ops["steps"], 1)) for n, c in ops.get("names", [])]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--fused", action="store_true", help="the fused optimizer train.py takes on CUDA")
    a = p.parse_args(argv)
    r = measure(Path(a.repo).resolve(), a.imgsz, a.batch_size, a.epochs, fused=a.fused)
    print(f"{a.repo}{' (fused optimizer)' if a.fused else ''}: yolov5n {a.imgsz} px batch {a.batch_size}, "
          f"{r['steps']} steps: {r['reads']:.1f} host reads/step, {r['ops']:.0f} operators/step, "
          f"{r['ms']:.1f} ms/step (median)")
    print("  most frequent operators per step: " + ", ".join(f"{n} {c:.0f}" for n, c in r["top"]))


if __name__ == "__main__":
    main()
