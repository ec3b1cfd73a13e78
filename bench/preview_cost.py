"""Cost of the batch previews (utils/report/previews.py) per call, and beside an epoch of the built-in dataset.

    OMP_NUM_THREADS=1 python bench/preview_cost.py

Draws real augmented batches of 16 (the built-in shapes dataset at 192 px, and COCO128 at 640 px when
../shared/datasets/coco128 exists) as train_batch and val_batch pictures and reports milliseconds per call,
then the share of an epoch that train.py's three train_batch previews would take if drawn in the loop
(an epoch of the built-in dataset = 25 steps of batch 16, timed with bench/tb_overhead.step_seconds).
Drawn on utils.report.previews.PreviewThread, as the wiring does, they overlap the step instead.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from utils.data.data_config import COCO_NAMES, load_hyp  # noqa: E402
from utils.data.datasets import create_dataloader  # noqa: E402
from utils.report.previews import plot_train_batch, plot_val_batch  # noqa: E402
from utils.data.synthetic import CLASSES, ensure_shapes_dataset  # noqa: E402


def _ms(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    from tb_overhead import step_seconds

    out = Path(tempfile.mkdtemp())
    sets = [("shapes", ensure_shapes_dataset() / "images" / "train", 192, CLASSES)]
    coco = ROOT.parent / "shared" / "datasets" / "coco128" / "images" / "train2017"
    if coco.is_dir():
        sets.append(("coco128", coco, 640, COCO_NAMES))
    train_ms = {}
    for name, src, size, names in sets:
        loader, _ = create_dataloader(src, size, 16, 32, hyp=load_hyp(), augment=True, workers=0, shuffle=True)
        imgs, targets, paths, _ = next(iter(loader))
        preds = [torch.cat([targets[targets[:, 0] == i, 2:4] * size - 10, targets[targets[:, 0] == i, 2:4] * size + 10,
                            torch.full(((targets[:, 0] == i).sum(), 1), 0.9), targets[targets[:, 0] == i, 1:2]], 1)
                 for i in range(len(imgs))]
        train_ms[name] = _ms(lambda: plot_train_batch(imgs, targets, paths, names, out / "train_batch0.jpg"))
        val = _ms(lambda: plot_val_batch(imgs, targets, preds, names, out / "l.jpg", out / "p.jpg", paths))
        print(f"{name} {size} px batch 16: plot_train_batch {train_ms[name]:.0f} ms/call, plot_val_batch "
              f"{val:.0f} ms/call (two pictures); {(out / 'train_batch0.jpg').stat().st_size / 1e3:.0f} kB")
    step, _ = step_seconds(192, 16, torch.device("cpu"), 4)
    epoch = 25 * step
    print(f"built-in dataset epoch on cpu: 25 steps x {step * 1e3:.0f} ms = {epoch:.1f} s; three train_batch previews "
          f"in the loop: {3 * train_ms['shapes'] / 1e3 / epoch:.2%} of epoch 0")


if __name__ == "__main__":
    main()
