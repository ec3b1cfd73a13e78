"""Per-step cost of TensorBoard logging (utils/report/tblog.py) against one training step, as a ratio.

    OMP_NUM_THREADS=1 python bench/tb_overhead.py               # yolov5n, 192 px, batch 16 (the built-in dataset)
    python bench/tb_overhead.py --device 0 --steps 50           # on a GPU, where a step is fastest

The step is what train.py does per batch: forward + loss under the run's autocast, scaled backward, update,
then the loss items to the CPU (on random images with ~6 targets each). The logging cost is measured apart
from it: `--calls` log_step calls with the values train.py has at hand (box/obj/cls as a CPU tensor, each
group's lr, the scaler's scale, skipped steps), then a flush that waits for TensorBoard's writer thread to
serialise and write them, so the thread's work is counted too. ratio = logging cost / step time; the issue's
target is under 1%. Timing the two interleaved would measure mostly the noise of a shared machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.yolo import Model  # noqa: E402
from utils.engine.amp import resolve_precision  # noqa: E402
from utils.data.data_config import load_hyp  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.engine.loss import ComputeLoss, loss_gains  # noqa: E402
from utils.engine.optim import AmpUpdater, build_optimizer  # noqa: E402


def step_seconds(imgsz: int, batch: int, device: torch.device, steps: int, cfg: str = "yolov5n.yaml") -> tuple[float, AmpUpdater]:
    """Median seconds of one training step (after 2 warm-up steps), and the updater (its scaler) used."""
    torch.manual_seed(0)
    model = Model(cfg, nc=80).to(device).train().to(memory_format=torch.channels_last)
    prec = resolve_precision("auto", device)
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, 80, imgsz))
    updater = AmpUpdater(model, build_optimizer(model, "SGD", 0.01, 0.937, 5e-4), prec)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, imgsz, imgsz, generator=g).to(device).contiguous(memory_format=torch.channels_last)
    n = batch * 6
    targets = torch.cat((torch.arange(n).remainder(batch)[:, None].float(), torch.randint(0, 80, (n, 1), generator=g).float(),
                         0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)), 1).to(device)

    def one() -> torch.Tensor:
        with prec.autocast():
            loss, items = loss_fn(model(x), targets)
        updater.backward(loss)
        updater.step()
        return items.cpu()  # train.py's per-step sync

    times = []
    for k in range(steps + 2):
        t0 = time.perf_counter()
        one()
        if k >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), updater


def log_seconds(calls: int, updater: AmpUpdater, every: int = 1) -> float:
    """Seconds per log_step call, the writer thread's serialisation and writes included."""
    from utils.report.tblog import open_logger

    items = torch.tensor([0.05, 0.02, 0.03])
    lrs = [g["lr"] for g in updater.optimizer.param_groups]
    with tempfile.TemporaryDirectory() as d:
        lg = open_logger(d, every=every)
        t0 = time.perf_counter()
        for s in range(calls):
            lg.log_step(s, items, lrs, updater.scaler.get_scale() if updater.scaler.is_enabled() else None, updater.skipped)
        lg.flush()
        dt = (time.perf_counter() - t0) / calls
        lg.close()
        size = sum(p.stat().st_size for p in Path(d).glob("events*"))
    print(f"event file: {size / calls:.0f} bytes per step logged")
    return dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--device", default="")
    opt = p.parse_args()
    device = select_device(opt.device)
    step, updater = step_seconds(opt.imgsz, opt.batch, device, opt.steps)
    for every in (1, 10):
        per_call = log_seconds(opt.calls, updater, every)
        print(f"every={every}: log_step {per_call * 1e6:.1f} us/step, training step {step * 1e3:.1f} ms "
              f"(yolov5n {opt.imgsz} px batch {opt.batch} on {device}); ratio {per_call / step:.3%}")


if __name__ == "__main__":
    main()
