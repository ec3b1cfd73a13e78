"""The training loop's rate: iterations and images per second of whole training epochs through train.py.

    python bench/loop_rate.py                                            # yolov5n 192 px batch 16, the built-in set
    python bench/loop_rate.py --data coco128.yaml --cfg yolov5s.yaml --imgsz 640 --batch-size 64 --cache ram \
        --epochs 6 --device 0 --json loop.json

train.run with callbacks around each epoch's training pass (on_epoch_start to on_train_epoch_end: loading,
steps and the end-of-epoch read of the losses; validation excluded with --noval); the first epoch is left out
(worker start, cache filling, kernel choice). Beside bench/gpu_amp.py's step rate on the same model, size and
batch this says how much of the step's speed the loop keeps (the GPU-throughput issue's loop goal).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

import train  # noqa: E402
from utils.data.data_config import DEFAULT_HYP_FILE  # noqa: E402
from utils.engine.callbacks import Callbacks  # noqa: E402


def loop_rate(epochs: int = 4, **options) -> dict:
    """{'it/s', 'img/s', 'epochs'} over the training passes after the first; options are train.run's."""
    marks, spans, batches = {}, [], {}
    cb = Callbacks()
    cb.register("on_epoch_start", lambda t, e: marks.__setitem__(e, time.perf_counter()))
    cb.register("on_train_epoch_end", lambda t, e: spans.append((e, time.perf_counter() - marks[e])))
    cb.register("on_train_batch", lambda t, ni, imgs, targets, paths: batches.__setitem__(ni, imgs.shape[0]))
    with tempfile.TemporaryDirectory() as tmp:
        if "hyp" not in options:  # the batch asked for: the short recipe's step floor would lower it on short runs
            hyp = {**yaml.safe_load(DEFAULT_HYP_FILE.read_text()), "min_steps": 0}
            options["hyp"] = str(Path(tmp) / "hyp.yaml")
            Path(options["hyp"]).write_text(yaml.safe_dump(hyp))
        out = train.run(epochs=epochs, noval=True, noplots=True, project=str(Path(tmp) / "runs"), callbacks=cb,
                        **options)
        nb = len(batches) // epochs
    timed = [s for e, s in spans if e > 0]
    n_images = sum(batches.values()) / epochs
    seconds = sum(timed)
    return {"it/s": nb * len(timed) / seconds, "img/s": n_images * len(timed) / seconds, "epochs": len(timed),
            "batches_per_epoch": nb, "images_per_epoch": n_images, "best_fitness": out.best_fitness}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="dataset YAML (default: the built-in shapes set)")
    p.add_argument("--cfg", default="yolov5n.yaml")
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--cache", default="auto")
    p.add_argument("--device", default="")
    p.add_argument("--amp", default="auto")
    p.add_argument("--no-deterministic", action="store_true", help="train.py's opt-out of deterministic algorithms")
    p.add_argument("--augment-on", default="auto", choices=["auto", "host", "device"], help="train.py's option")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    opts = dict(cfg=a.cfg, imgsz=a.imgsz, batch_size=a.batch_size, workers=a.workers, cache=a.cache, device=a.device,
                amp=a.amp, deterministic=not a.no_deterministic, augment_on=a.augment_on,
                **({"data": a.data} if a.data else {}))
    r = loop_rate(a.epochs, **opts)
    print(f"loop: {a.cfg} {a.imgsz} px batch {a.batch_size} --amp {a.amp}{' --no-deterministic' * a.no_deterministic} "
          f"--augment-on {a.augment_on} --workers {a.workers} "
          f"on {a.device or 'auto'}: {r['it/s']:.1f} it/s, "
          f"{r['img/s']:.0f} images/s over {r['epochs']} epochs of {r['batches_per_epoch']} batches")
    if a.json:
        Path(a.json).write_text(json.dumps({**r, **opts}, indent=1))


if __name__ == "__main__":
    main()
