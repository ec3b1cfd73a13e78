"""JPEG decoding with the cache off: cv2.imdecode on one CPU core (what a loader worker does) beside
torchvision.io.decode_jpeg on the training device, batched (what --augment-on device could use instead).

    python bench/decode_speed.py [--data ../shared/datasets/coco128/coco128.yaml] [--device 0] [--rounds 3] [--json OUT]

The files are read into memory first; only decoding is timed (the best of --rounds passes over every JPEG of
the training split). A GPU is synchronised at both ends of each pass.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from utils.data.data_config import SHARED_COCO128, load_data_config  # noqa: E402
from utils.data.labels import list_image_files  # noqa: E402
from utils.device import select_device  # noqa: E402


def decode_rates(files: list[str], device: str = "0", rounds: int = 3, batch: int = 64) -> dict:
    from torchvision.io import decode_jpeg

    blobs = [Path(f).read_bytes() for f in files if f.lower().endswith((".jpg", ".jpeg"))]
    cv2.setNumThreads(1)
    best_cv2 = min(_timed(lambda: [cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) for b in blobs])
                   for _ in range(rounds))
    dev = select_device(device)
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def gpu_pass():
        for k in range(0, len(tensors), batch):
            decode_jpeg(tensors[k:k + batch], device=dev)
        sync()

    gpu_pass()  # the decoder's start-up
    best_dev = min(_timed(gpu_pass) for _ in range(rounds))
    return {"images": len(blobs), "cv2 img/s (1 core)": len(blobs) / best_cv2,
            f"decode_jpeg img/s ({dev.type})": len(blobs) / best_dev, "device": str(dev)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(SHARED_COCO128 / "coco128.yaml"))
    p.add_argument("--device", default="0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    r = decode_rates(list_image_files(load_data_config(a.data)["train"]), a.device, a.rounds)
    print(json.dumps(r))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
