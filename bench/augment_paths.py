"""The same training batches through both --augment-on paths, side by side, on any dataset.

    python bench/augment_paths.py --data ../shared/datasets/rice-pest/rice-pest.yaml --imgsz 320 [--epochs 0 5]
                                  [--batches 4] [--batch-size 16] [--seed 1] [--device cpu]

For each of the first --batches batches of each epoch listed: whether the two paths kept the same boxes (and the
largest difference of their normalised coordinates), the mean and largest pixel difference in grey levels, the
share of pixel values that differ, and each path's mean grey level. The training loader's settings otherwise
(default hyperparameters, mosaic, cache ram, seeded shuffle, one process).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.data.data_config import load_data_config, load_hyp  # noqa: E402
from utils.data.datasets import create_dataloader  # noqa: E402
from utils.data.device_augment import DeviceAugment  # noqa: E402
from utils.errors import run_cli  # noqa: E402


def compare(data: str, imgsz: int, epochs: list[int], batches: int, batch_size: int, seed: int, device: str) -> list[dict]:
    hyp = load_hyp()
    train = load_data_config(data)["train"]
    kw = dict(hyp=hyp, augment=True, shuffle=True, seed=seed, cache="ram", workers=0)
    host, _ = create_dataloader(train, imgsz, batch_size, 32, **kw)
    dev, _ = create_dataloader(train, imgsz, batch_size, 32, augment_on="device", **kw)
    augment_host, augment_dev = DeviceAugment(hyp, device), DeviceAugment(hyp, device)
    rows = []
    for epoch in epochs:
        host.sampler.set_epoch(epoch)
        dev.sampler.set_epoch(epoch)
        for k, (h, d) in enumerate(zip(host, dev)):
            if k == batches:
                break
            (hi, ht), (di, dt) = augment_host(*h[:2]), augment_dev(*d[:2])
            diff = ((hi - di) * 255).abs()
            same = ht.shape == dt.shape and bool((ht[:, :2] == dt[:, :2]).all())
            rows.append({"epoch": epoch, "batch": k, "boxes": len(ht), "same_boxes": same,
                         "box_diff": float((ht[:, 2:] - dt[:, 2:]).abs().max()) if same and len(ht) else 0.0,
                         "mean_diff": float(diff.mean()), "max_diff": float(diff.max()),
                         "differ": float((diff > 0.5).float().mean()), "host_mean": float(hi.mean() * 255),
                         "device_mean": float(di.mean() * 255)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--epochs", type=int, nargs="+", default=[0, 5])
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    rows = compare(a.data, a.imgsz, a.epochs, a.batches, a.batch_size, a.seed, a.device)
    print(f"{'epoch':>5} {'batch':>5} {'boxes':>5} {'same boxes':>10} {'box diff':>9} {'pixel diff mean':>15} "
          f"{'max':>4} {'values that differ':>18} {'mean level host / device':>25}")
    for r in rows:
        print(f"{r['epoch']:>5} {r['batch']:>5} {r['boxes']:>5} {str(r['same_boxes']):>10} {r['box_diff']:>9.1e} "
              f"{r['mean_diff']:>15.5f} {r['max_diff']:>4.0f} {r['differ']:>17.4%} "
              f"{r['host_mean']:>12.3f} / {r['device_mean']:.3f}")


if __name__ == "__main__":
    run_cli(main)
