"""Which weight average of one training run ends best, and steadiest across seeds.

    python bench/ema_horizon.py --datasets paste8 --seeds 0 1 2 3 4 5 6 7 8 9
    python bench/ema_horizon.py --summary

The final mAP of a short run from scratch is the mAP of an average of its last weights: train.py's EMA,
whose decay ramps as 0.9999 * (1 - exp(-updates / tau)) with tau a quarter of the schedule, so it
ends averaging over about the last 55 steps. A longer average could smooth out where each seed
happens to stop, and narrow the spread between seeds; or it could drag in older, worse weights.

Each (dataset, seed) trains once, exactly as bench/fidelity.py's mode does (the same train.py
options, in this process), and beside the run's own EMA keeps several more averages of the same
trajectory, each updated after every optimizer step:

- `ema/K`: the EMA with tau = steps / K (`ema/4` is train.py's; it must equal the run's own EMA,
  which the script checks);
- `swa/F`: the plain mean of the weights after each step over the last fraction F of the steps;
- `raw`: the last step's weights, no average.

Every average is evaluated on the val split after the last epoch, the way train.py validates its EMA.
Because the trajectory is shared, the variants' differences at one seed are paired: they come from the
averaging alone, not from a different run. Rows go to bench/out/ema_horizon.csv as each run ends; a
rerun skips what is done.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fidelity import (DATASETS, append_result, ensure_dataset, parse_run_args, read_results,  # noqa: E402
                            seed_sets, train_in_process)
from utils.engine.dist import de_parallel  # noqa: E402

EMA_K = (2, 3, 4, 5, 6, 8)  # tau = steps / K; 4 is train.py's (utils/engine/optim.ema_tau_for)
SWA_F = (0.1, 0.25, 0.5)
REFERENCE = "ema/4"
FIELDS = ("dataset", "mode", "seed", "variant", "map50", "map", "wall_s", "ema_check")


class Averages:
    """Weight averages of one trajectory. `update(model, step)` after each optimizer step (1-based);
    `steps` is the schedule's length. Floating-point state (weights and BatchNorm statistics) is
    averaged; integer buffers take the latest value, as utils/engine/ema.ModelEMA does."""

    def __init__(self, model: torch.nn.Module, steps: int, ema_k=EMA_K, swa_f=SWA_F, decay: float = 0.9999):
        import copy

        self.steps, self.decay = steps, decay
        self.models: dict[str, torch.nn.Module] = {}
        self.taus = {f"ema/{k:g}": steps / k for k in ema_k}
        self.swa_start = {f"swa/{f:g}": steps - max(1, round(f * steps)) + 1 for f in swa_f}  # first step averaged
        for name in [*self.taus, *self.swa_start]:
            m = copy.deepcopy(de_parallel(model)).float().eval()
            for p in m.parameters():
                p.requires_grad_(False)
            self.models[name] = m

    def weight(self, name: str, step: int) -> float:
        """How much of the new weights enters average `name` at `step` (0: not yet)."""
        if name in self.taus:
            return 1.0 - self.decay * (1 - math.exp(-step / self.taus[name]))
        start = self.swa_start[name]
        return 0.0 if step < start else 1.0 / (step - start + 1)

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        src = de_parallel(model).state_dict()
        for name, avg in self.models.items():
            w = self.weight(name, step)
            if w == 0.0:
                continue
            floats_a, floats_m = [], []
            for k, v in avg.state_dict().items():
                if v.is_floating_point():
                    floats_a.append(v)
                    floats_m.append(src[k].detach().float())
                else:
                    v.copy_(src[k])
            torch._foreach_lerp_(floats_a, floats_m, w)


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa if sa[k].is_floating_point())


def run_one(dataset: str, mode: str, seed: int, runs: Path) -> list[dict]:
    """Train (dataset, mode, seed) as bench/fidelity.py does and evaluate every average."""
    import validator
    from utils.engine.callbacks import Callbacks

    epochs = DATASETS[dataset][1]
    state: dict = {}

    def start(t):
        state["avg"] = Averages(t.model, epochs * len(t.train_loader))
        state["updates"] = t.ema.updates

    def step(t, ni, items):
        if t.ema.updates != state["updates"]:  # an optimizer step happened (and was not skipped)
            state["updates"] = t.ema.updates
            state["avg"].update(t.model, t.ema.updates)

    def end(t):
        models = {**state["avg"].models, "raw": de_parallel(t.model).float().eval()}
        state["check"] = max_difference(models[REFERENCE], t.ema.ema)
        state["maps"] = {}
        for variant, m in models.items():
            r = validator.run(data=t.s.data, model=m, dataloader=t.val_loader, batch_size=t.s.batch_per_process * 2,
                              imgsz=t.s.imgsz, plots=False, verbose=False, half=False)
            state["maps"][variant] = (r.map50, r.map)

    cb = Callbacks()
    cb.register("on_train_start", start)
    cb.register("on_step_end", step)
    cb.register("on_train_end", end)
    wall = train_in_process(dataset, mode, seed, runs, f"{dataset}-{mode}-s{seed}", cb)
    return [{"dataset": dataset, "mode": mode, "seed": seed, "variant": v, "map50": round(m50, 6), "map": round(m, 6),
             "wall_s": wall, "ema_check": f"{state['check']:.3g}"} for v, (m50, m) in state["maps"].items()]


def variant_order(variant: str) -> tuple[str, float]:
    """ema/2 < ema/10 (by the number, not the text), then raw, then swa/..."""
    kind, _, value = variant.partition("/")
    return kind, float(value) if value else 0.0


def summary(rows: list[dict]) -> str:
    """Per dataset and variant: mAP@0.5:0.95 per seed, mean, standard deviation, the stall rule's 3-seed
    count, and the paired change against train.py's EMA at the same seeds."""
    out = []
    for (dataset, mode) in sorted({(r["dataset"], r["mode"]) for r in rows}):
        sel = [r for r in rows if r["dataset"] == dataset and r["mode"] == mode]
        seeds = sorted({int(r["seed"]) for r in sel})
        by = {(r["variant"], int(r["seed"])): float(r["map"]) for r in sel}
        out.append(f"{dataset} {mode}, seeds {' '.join(map(str, seeds))}")
        out.append("| variant | per seed | mean | std | 3-seed sets passing | worst of 3, mean "
                   f"| vs {REFERENCE}: mean, seeds higher |")
        out.append("|---|---|---|---|---|---|---|")
        variants = sorted({r["variant"] for r in sel}, key=variant_order)
        for v in variants:
            maps = [by[v, s] for s in seeds if (v, s) in by]
            if len(maps) != len(seeds):
                continue
            ok, total, worst = seed_sets(maps) if len(maps) >= 3 else (0, 0, float("nan"))
            diffs = [by[v, s] - by[REFERENCE, s] for s in seeds if (REFERENCE, s) in by]
            sd = statistics.stdev(maps) if len(maps) > 1 else 0.0
            out.append(f"| {v} | {' '.join(f'{m:.3f}'.lstrip('0') for m in maps)} | {statistics.mean(maps):.3f} | "
                       f"{sd:.3f} | {ok}/{total} | {worst:.3f} | {statistics.mean(diffs):+.4f}, "
                       f"{sum(d > 0 for d in diffs)}/{len(diffs)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    a = parse_run_args(p, argv, "ema_horizon", summary)
    if a is None:
        return
    path = Path(a.csv)
    done = {(r["dataset"], r["mode"], int(r["seed"])) for r in read_results(path)}
    for seed in a.seeds:
        for dataset in a.datasets:
            if (dataset, a.mode, seed) in done:
                continue
            ensure_dataset(dataset)
            for row in run_one(dataset, a.mode, seed, Path(a.runs)):
                append_result(path, row, FIELDS)
            print(summary([r for r in read_results(path) if r["dataset"] == dataset]), flush=True)


if __name__ == "__main__":
    main()
