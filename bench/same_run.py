"""Is a seeded run a function of its command here? Two runs of the same command, compared bit for bit.

    python bench/same_run.py                              # the built-in set, 2 epochs at 192 px, default device
    python bench/same_run.py --device 0 --epochs 3 --json same.json

Prints whether the two runs' final EMA weights and results.csv rows (wall-clock column aside) are identical,
and the largest weight difference when they are not. train.py runs with deterministic algorithms unless
--no-deterministic is given (then this shows what they buy).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402
from utils.report.results import read_rows  # noqa: E402


def same_run(**options) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [train.run(project=f"{tmp}/run{k}", noplots=True, **options) for k in range(2)]
        a, b = (r.ema.state_dict() for r in runs)
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
        rows = [read_rows(r.save_dir / "results.csv", clock=False) for r in runs]
    return {"identical_weights": diff == 0.0, "max_weight_diff": diff, "identical_results": rows[0] == rows[1]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="dataset YAML (default: the built-in set)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--imgsz", type=int, default=192)
    p.add_argument("--device", default="")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--no-deterministic", action="store_true")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    r = same_run(epochs=a.epochs, imgsz=a.imgsz, device=a.device, workers=a.workers, seed=0,
                 deterministic=not a.no_deterministic, **({"data": a.data} if a.data else {}))
    print(f"same command twice ({a.epochs} epochs, device {a.device or 'auto'}, deterministic "
          f"{not a.no_deterministic}): weights identical {r['identical_weights']} (max diff {r['max_weight_diff']:.3g}), "
          f"results.csv identical {r['identical_results']}")
    if a.json:
        Path(a.json).write_text(json.dumps(r))


if __name__ == "__main__":
    main()
