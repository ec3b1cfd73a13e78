"""Rebuild bench/results/early_remedies.{csv,txt} from the runs behind them.

    python bench/assemble_early_remedies.py

The early-remedies table (README, "How the defaults are decided") sets the shipped recipe beside this
machine's own runs of the recipe before it, so it joins three sources:

- bench/results/fidelity_rerun_paste8.csv: `fp32-lr2`'s ten paste8 seeds, rerun on this machine;
- `fp32-lr2`'s ten paste10n seeds: the runs of bench/ema_horizon.py (bench/out/ema_horizon/), whose
  train.py EMA is its `ema/4` variant; each is summarised from its run folder, as the harness does, and
  must give the mAP bench/results/ema_horizon.csv holds for it;
- bench/out/early.csv: the harness rows of the new modes (`python bench/fidelity.py ... --csv
  bench/out/early.csv --runs bench/out/early`, commands in the README) less its first row, the repeat of
  `fp32-lr2` paste8 seed 2 that checked determinism (bench/results/determinism_paste8.txt).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fidelity import DATASETS, FIELDS, OUT, summarise_run, summary  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def main() -> None:
    sources = [RESULTS / "fidelity_rerun_paste8.csv", RESULTS / "ema_horizon.csv", OUT / "early.csv",
               OUT / "ema_horizon"]
    for src in sources:
        if not src.exists():
            raise SystemExit(f"{src}: missing; the runs behind it are made by the commands under README "
                             f"\"Early remedies\" (bench/fidelity.py, bench/ema_horizon.py)")
    rows = list(csv.DictReader(open(sources[0])))
    _, epochs, imgsz = DATASETS["paste10n"]
    for r in csv.DictReader(open(RESULTS / "ema_horizon.csv")):
        if r["dataset"] == "paste10n" and r["variant"] == "ema/4":
            run = Path("bench/out/ema_horizon") / f"paste10n-fp32-lr2-s{r['seed']}"  # relative, as the CSV records
            if not (ROOT / run / "results.csv").exists():
                raise SystemExit(f"{ROOT / run}: missing; rerun `python bench/ema_horizon.py` (README \"Early remedies\")")
            row = summarise_run(ROOT / run, "paste10n", "fp32-lr2", int(r["seed"]), epochs, imgsz, float(r["wall_s"]))
            if row["map"] != float(r["map"]):
                raise SystemExit(f"{run}: mAP {row['map']} is not ema_horizon.csv's {r['map']}; the run folder changed")
            rows.append({**row, "run": str(run)})
    rows += list(csv.DictReader(open(OUT / "early.csv")))[1:]  # row 1: the determinism repeat
    with open(RESULTS / "early_remedies.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    (RESULTS / "early_remedies.txt").write_text(summary(rows) + "\n")


if __name__ == "__main__":
    main()
