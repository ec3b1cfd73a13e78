"""Evaluate a detector on a dataset split: mAP@0.5, mAP@0.5:0.95, P, R, speed, plots, COCO JSON.

    python test.py --weights runs/train/exp/weights/best.pt --data data/coco128.yaml
    python test.py --weights a.pt b.pt --task speed

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


def parse_opt(argv: Sequence[str] | None = None) -> EvalOptions:
    return parse_options(EvalOptions, argv, "Evaluate checkpoints: mAP, P, R, speed, plots, COCO JSON.")


def main(argv: Sequence[str] | None = None) -> list[ValResult]:
    opts = parse_opt(argv)
    results = []
    for w in opts.weights:
        results.append(evaluate(replace(opts, weights=w)))
    return results


if __name__ == "__main__":
    run_cli(main)
