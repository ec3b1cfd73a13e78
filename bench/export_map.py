"""test.py mAP of a checkpoint and of its exported files, in one table.

    OMP_NUM_THREADS=1 python bench/export_map.py --weights best.pt --data coco128.yaml --imgsz 320

Exports (into bench/out/export_map/) ONNX --dynamic, ONNX static, TorchScript static and ONNX --half, then runs
test.run on the same split with each file and with the .pt. A --dynamic export sees the .pt's rectangular
batches and must match it; a static one takes square batches at its fixed size (utils/interop/backends.py), so it is
compared with the .pt evaluated on the same square batches.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
import export  # noqa: E402
import validator as evaluator  # noqa: E402
from bench.export_speed import publish  # noqa: E402
from models.yolo import load_for_inference  # noqa: E402
from utils.data.data_config import load_data_config  # noqa: E402
from utils.files import REPO_ROOT  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "export_map"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    pt = OUT / "best.pt"
    shutil.copy(args.weights, pt)
    files = {
        "best.pt (rect batches)": pt,
        "best.onnx --dynamic": export.run(pt, ("onnx",), args.imgsz, dynamic=True, device="cpu", output_dir=OUT / "dynamic")[0],
        "best.torchscript --dynamic": export.run(pt, ("torchscript",), args.imgsz, dynamic=True, device="cpu",
                                                 output_dir=OUT / "dynamic")[0],
        "best.onnx --half --dynamic": export.run(pt, ("onnx",), args.imgsz, half=True, dynamic=True, device="cpu",
                                                 output_dir=OUT / "half")[0],
        "best.onnx static": export.run(pt, ("onnx",), args.imgsz, batch_size=args.batch_size, device="cpu",
                                       output_dir=OUT / "static")[0],
    }
    data = load_data_config(args.data)
    rows = []
    for label, w in files.items():
        r = evaluator.run(data, weights=w, imgsz=args.imgsz, batch_size=args.batch_size, device="cpu", plots=False,
                          workers=1)
        rows.append((label, r.map50, r.map, r.speed["inference"]))
    # the .pt on the square batches a static export is fed (test.py's loader with rect off)
    backend = load_for_inference(pt, torch.device("cpu"))
    loader = evaluator._make_loader(data, "val", args.imgsz, args.batch_size, 32, False, 1, rect_ok=False)
    r = evaluator.run(data, model=backend.model, dataloader=loader, plots=False, device="cpu")
    rows.append(("best.pt (square batches)", r.map50, r.map, r.speed["inference"]))
    lines = [f"bench/export_map.py: {args.weights} on {args.data} at --imgsz {args.imgsz}, batch {args.batch_size}, CPU",
             f"{'weights':30s} {'mAP@0.5':>8s} {'mAP@.5:.95':>11s} {'infer ms/img':>13s}"]
    lines += [f"{lab:30s} {m50:8.4f} {m:11.4f} {t:13.1f}" for lab, m50, m, t in rows]
    base = rows[0][2]
    lines.append("differences from the .pt (rect): " + ", ".join(f"{lab}: {m - base:+.4f}" for lab, _, m, _ in rows[1:4]))
    lines.append(f"static ONNX vs .pt on square batches: {rows[4][2] - rows[5][2]:+.4f}")
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
