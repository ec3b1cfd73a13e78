"""Evaluate a detector on a dataset split: mAP@0.5, mAP@0.5:0.95, P, R, speed, plots, COCO JSON.

    python test.py --weights runs/train/exp/weights/best.pt --data data/coco128.yaml
    python test.py --weights a.pt b.pt                # one ensemble of both (YOLOv5's val.py does the same)
    python test.py --weights a.pt b.pt --task speed   # each timed in turn, to compare them

The command line of validator.py, which holds the evaluation itself (`validator.run`, what train.py
calls on its live model). Programs import validator; `test` is also the name of Python's own test
package, which `import test` finds whenever this folder is not first on sys.path.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from utils.errors import run_cli
from utils.options import parse_options
from validator import EvalOptions, ValResult, evaluate

# flags of YOLOv5's val.py this one does not take, with what to do instead
YOLOV5_ONLY = {"--dnn": "ONNX files run through ONNX Runtime (python export.py, then --weights best.onnx)",
               "--save-hybrid": "not implemented: it mixes labels into predictions and so overstates mAP"}


def parse_opt(argv: Sequence[str] | None = None) -> EvalOptions:
    return parse_options(EvalOptions, argv, "Evaluate checkpoints: mAP, P, R, speed, plots, COCO JSON.", YOLOV5_ONLY)


def main(argv: Sequence[str] | None = None) -> list[ValResult]:
    """One result for the --weights (several: one ensemble), or with --task speed one per file, timed in turn:
    as YOLOv5's val.py, a speed run compares models rather than combining them."""
    opts = parse_opt(argv)
    weights = list(opts.weights) if isinstance(opts.weights, (list, tuple)) else [opts.weights]
    if opts.task == "speed" and len(weights) > 1:
        return [evaluate(replace(opts, weights=w)) for w in weights]
    return [evaluate(replace(opts, weights=weights[0] if len(weights) == 1 else weights))]


if __name__ == "__main__":
    run_cli(main)
