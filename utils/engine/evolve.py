"""Hyperparameter evolution, `python train.py --evolve [N]`: YOLOv5's genetic search over the hyperparameters
that this project's recipe actually uses.

    python train.py --evolve 30 --epochs 10 --imgsz 192     # 30 short runs with these options
    python train.py --evolve 30 --epochs 10 --imgsz 192     # the same command again: continues where it stopped
    python train.py --hyp runs/evolve/exp/hyp_evolve.yaml --epochs 100 ...   # train with the fittest

The search. Generation 0 trains the given --hyp as it stands. Each later generation picks a parent among the
5 fittest so far, drawn with weights fitness - (the lowest of the 5) (YOLOv5's 'single' parent), multiplies
each gene with probability 0.8 by a factor 1 + N(0, 1) * 0.2 * u (u one uniform draw per generation, so some
generations move far and most little; the factor kept in 0.3..3), clips it to the gene's bounds and trains
a run with the user's own options. Fitness is that run's final 0.1 * mAP@0.5 + 0.9 * mAP@0.5:0.95
(utils/report/metrics.fitness): the generations validate after their last epoch only, as in YOLOv5, and save
no pictures.

The folder, <project>/<name> (project runs/evolve unless --project is given), is never incremented: it is how
a rerun finds its own search.
    opt.yaml, hyp_base.yaml   the command and the contents of its --hyp, compared when a rerun continues
    evolve.csv                a row per finished generation: fitness, metrics and the value of every gene
    hyp_evolve.yaml           the fittest generation's hyperparameters (rewritten after every generation)
    evolve.png                each gene against fitness (drawn when the search ends or is interrupted)
    gen000/, gen001/, ...     each generation's run folder (seed: --seed + generation; hyp_given.yaml is the
                              --hyp it was given). Only the fittest keeps its weights/: 300 generations would
                              otherwise keep 600 checkpoints.

Resume: rerun the same command. evolve.csv is the whole state of the search: generation k's parent and
mutation are drawn from the rows before it with a generator seeded by (--seed, k), and its run is seeded
too, so a continued search writes the rows an uninterrupted one would have. A generation cut short starts
again from scratch (its folder is cleared; a seeded run repeats itself). N counts every generation: a rerun
trains the ones still missing, a larger N extends the search. A different command (other data, epochs,
hyp file contents, ...) in the same folder is refused; give that one another --name. --resume, which
continues one run from its last.pt, is not how a search continues and is refused with --evolve.

What is evolved: the keys that change what the run's recipe does (utils/engine/optim.choose_recipe), which
depends on the optimizer the runs use, so generation 0's run decides it (genes_for). The AdamW recipe that
--optimizer auto picks for short schedules sets its own lr and momentum: there lr0 and momentum change
nothing, and lr_adam_gain, warmup_epochs_adam and warmup_bias_lr_adam are what steer it.

hyp_evolve.yaml is the --hyp the fittest generation was given (the base file with the evolved values), not the
hyp.yaml its run resolved. A search trains short runs, and a resolved hyp settles the recipe as it stands
(utils/engine/optim.settled_recipe): the longer run it is meant for would inherit the short run's EMA ramp,
warmup and batch- and class-scaled lr. The given form keeps the recipe's inputs (lr_adam_gain, ...), so
choose_recipe fits them to the next run's batch size, schedule and classes as it did for the generation;
gen<k>/hyp.yaml beside it repeats that generation exactly.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from utils.hyp import HYP_RULES, Hyp, load_hyp
from utils.engine.callbacks import Callbacks
from utils.engine.dist import dist_info
from utils.engine.optim import Recipe
from utils.engine.train_options import TrainOptions
from utils.errors import StopSignals, UserError
from utils.files import RunLock, atomic_write, increment_path, load_yaml, save_yaml
from utils.inference import check_rules
from utils.options import as_dict, command_line

LOGGER = logging.getLogger(__name__)

EVOLVE_PROJECT = "runs/evolve"  # where a search goes when --project is left at train.py's default (as YOLOv5)
TOP_PARENTS = 5  # a parent is drawn from this many of the fittest generations
MUTATION_PROB, MUTATION_SIGMA = 0.8, 0.2  # YOLOv5's: the chance that a gene mutates, the factor's spread
FACTOR_RANGE = (0.3, 3.0)  # a mutation at most divides a gene (plus its offset) by 3.3 or multiplies it by 3
SIGNIFICANT = 5  # digits a mutated value keeps: readable files, and values that survive the trip through evolve.csv
METRICS = ("metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95")  # results.csv's names
FIXED_COLUMNS = ("generation", "fitness", *METRICS)  # evolve.csv's columns before the genes
# options that do not change what a generation trains: a rerun may give them differently (the search forces the
# last five for its runs)
FREE_ON_RERUN = ("evolve", "device", "workers", "cache", "exist_ok", "noval", "nosave", "noplots", "save_period")


@dataclass(frozen=True)
class Gene:
    """An evolved hyperparameter's bounds (never wider than HYP_RULES', see bounds()) and offset. The mutation
    multiplies value + offset and takes the offset off again: a gene at 0 can then move (a product of 0 stays 0,
    so YOLOv5's degrees, shear and mixup, 0 in its own hyps, never evolve) and the clip can bring it back to 0."""

    low: float
    high: float
    offset: float = 0.0


GENES: dict[str, Gene] = {
    # optimizer and schedule
    "lr0": Gene(1e-5, 0.1), "lrf": Gene(0.01, 1.0), "momentum": Gene(0.6, 0.98),
    "weight_decay": Gene(0.0, 0.001, 5e-5), "warmup_momentum": Gene(0.0, 0.95, 0.05),
    "warmup_epochs": Gene(0.0, 10.0, 0.25), "warmup_bias_lr": Gene(0.0, 0.2, 0.01),
    "lr_adam_gain": Gene(0.1, 5.0), "warmup_epochs_adam": Gene(0.0, 10.0, 0.25),
    "warmup_bias_lr_adam": Gene(0.0, 0.2, 0.01), "warmup_max_fraction": Gene(0.01, 1.0),
    # loss
    "box": Gene(0.02, 0.5), "cls": Gene(0.2, 4.0), "cls_pw": Gene(0.5, 2.0), "obj": Gene(0.2, 4.0),
    "obj_pw": Gene(0.5, 2.0), "anchor_t": Gene(2.0, 8.0),
    # augmentation (perspective stays as given: YOLOv5 does not evolve it either, its warp degrades fast)
    "hsv_h": Gene(0.0, 0.1, 0.005), "hsv_s": Gene(0.0, 0.9, 0.05), "hsv_v": Gene(0.0, 0.9, 0.05),
    "degrees": Gene(0.0, 45.0, 2.0), "translate": Gene(0.0, 0.9, 0.02), "scale": Gene(0.0, 0.9, 0.05),
    "shear": Gene(0.0, 10.0, 1.0), "flipud": Gene(0.0, 1.0, 0.05), "fliplr": Gene(0.0, 1.0, 0.05),
    "mosaic": Gene(0.0, 1.0, 0.05), "mixup": Gene(0.0, 1.0, 0.05),
}
# What each recipe reads (utils/engine/optim.choose_recipe and its recipes, apply_warmup, lr_lambda):
# YOLOv5's SGD, and a resolved hyp's settled recipe, take lr0, momentum, the warmup and the bias warmup lr as given
SGD_GENES = ("lr0", "momentum", "warmup_epochs", "warmup_bias_lr")
# an explicit --optimizer Adam/AdamW takes lr0 and momentum (beta1); the biases' warmup lr is warmup_bias_lr_adam
# when the hyp has it (its base is what the recipe gave generation 0)
ADAM_GENES = ("lr0", "momentum", "warmup_epochs", "warmup_bias_lr_adam")
# --optimizer auto's AdamW for short schedules: its own lr (times lr_adam_gain) and momentum 0.9; warmup and bias
# warmup from the _adam keys when the hyp has them
ADAMW_AUTO_GENES = ("lr_adam_gain", "warmup_epochs_adam", "warmup_bias_lr_adam")
SHARED_GENES = ("lrf", "weight_decay", "warmup_momentum",  # every recipe: schedule, decay, momentum/beta1 ramp
                "box", "cls", "cls_pw", "obj", "obj_pw", "anchor_t",  # utils/engine/loss.py (fl_gamma, iou_t: unused)
                "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "flipud", "fliplr", "mosaic",
                "mixup")  # utils/data/datasets.py (copy_paste is not implemented and must stay 0)
MOSAIC_GENES = ("mosaic", "mixup")  # --rect trains without mosaics, so these change nothing there
# a gene's value in generation 0 when the hyp leaves it out: what the recipe used instead (augmentations: 0, the
# dataset's default)
RECIPE_DEFAULTS: dict[str, Callable[[Recipe], float]] = {
    "lr_adam_gain": lambda r: 1.0, "warmup_epochs_adam": lambda r: r.warmup_epochs,
    "warmup_bias_lr_adam": lambda r: r.warmup_bias_lr, "warmup_max_fraction": lambda r: r.warmup_max_fraction}


def bounds(key: str) -> tuple[float, float]:
    """The gene's bounds, within HYP_RULES' by construction: a mutation never makes a hyp check_hyp refuses."""
    gene, (low, high, _) = GENES[key], HYP_RULES[key]
    return max(gene.low, low), min(gene.high, high)


# ----------------------------------------------------------------------------------------------- what is evolved
def genes_for(recipe: Recipe, optimizer_option: str, hyp: Hyp, rect: bool, batches: int,
              epochs: int) -> tuple[str, ...]:
    """The genes that change what a run with this recipe trains (generation 0's recipe: later generations keep
    its optimizer, as no gene changes the choice). `batches` per epoch and `epochs` decide whether the warmup's
    length in epochs can act (Recipe.warmup_steps): a short run's warmup is warmup_max_fraction of its batches
    whatever the epochs say (by default the whole of any run under 100 batches, as the warmup is at least
    MIN_WARMUP_STEPS = 100), so that share is evolved instead."""
    if hyp.optimizer is not None:  # a resolved hyp.yaml: choose_recipe takes its numbers as they stand
        optim = SGD_GENES
    elif recipe.kind == "short":
        optim = ADAMW_AUTO_GENES
    else:
        optim = SGD_GENES if recipe.optimizer == "SGD" else ADAM_GENES
    if recipe.kind == "continue":  # its biases warm up from 0 whatever the hyp says
        optim = tuple(k for k in optim if k != "warmup_bias_lr")
    warmup = next(k for k in optim if k.startswith("warmup_epochs"))
    low, high = bounds(warmup)
    if replace(recipe, warmup_epochs=low).warmup_steps(batches, epochs) == \
            replace(recipe, warmup_epochs=high).warmup_steps(batches, epochs):
        optim = tuple("warmup_max_fraction" if k == warmup else k for k in optim)
    return tuple(k for k in (*optim, *SHARED_GENES) if not (rect and k in MOSAIC_GENES))


def base_values(hyp: Hyp, recipe: Recipe, genes: tuple[str, ...]) -> dict[str, float]:
    """Generation 0's value of every gene: the hyp's, else what its run used in its place."""
    return {k: float(getattr(hyp, k)) if hyp.sets(k) else RECIPE_DEFAULTS[k](recipe) if k in RECIPE_DEFAULTS
            else 0.0 for k in genes}


# ----------------------------------------------------------------------------------------------- the genetics
def generation_rng(seed: int, generation: int) -> np.random.Generator:
    """The randomness of one generation's parent and mutation: a function of (--seed, generation) only, so a
    continued search draws what an uninterrupted one would."""
    return np.random.default_rng([seed & 0xFFFFFFFF, generation])


def select_parent(rows: list[dict[str, float]], genes: tuple[str, ...], rng: np.random.Generator,
                  top: int = TOP_PARENTS) -> dict[str, float]:
    """One of the `top` fittest rows, drawn with weights fitness - (the lowest of them) (+1e-6, so equal
    fitnesses draw evenly); its gene values."""
    fitness = np.nan_to_num(np.array([r["fitness"] for r in rows], dtype=float), nan=0.0)
    best = np.argsort(-fitness, kind="stable")[:top]  # ties: the earlier generation first
    w = fitness[best] - fitness[best].min() + 1e-6
    pick = best[rng.choice(len(best), p=w / w.sum())]
    return {k: rows[pick][k] for k in genes}


def mutate(parent: dict[str, float], genes: tuple[str, ...], rng: np.random.Generator,
           prob: float = MUTATION_PROB, sigma: float = MUTATION_SIGMA) -> dict[str, float]:
    """The parent's genes, mutated (see the module's docstring) and clipped to bounds(); drawn again until at
    least one value differs from the parent's, so no generation repeats its parent."""
    v = np.array([parent[k] for k in genes], dtype=float)
    offset = np.array([GENES[k].offset for k in genes])
    low, high = np.array([bounds(k) for k in genes]).T
    for _ in range(100):  # a change almost always comes at the first draw
        mask = rng.random(len(genes)) < prob
        factor = np.clip(1 + mask * rng.standard_normal(len(genes)) * rng.random() * sigma, *FACTOR_RANGE)
        out = np.clip((v + offset) * factor - offset, low, high)
        out = np.clip([float(f"{x:.{SIGNIFICANT}g}") for x in out], low, high) + 0.0  # + 0.0: no -0.0 in files
        if (out != v).any():
            break
    return {k: float(x) for k, x in zip(genes, out)}


# ----------------------------------------------------------------------------------------------- the folder
class SearchFolder:
    """<project>/<name>: the options and base hyp it was started with, evolve.csv, and what is derived from it."""

    def __init__(self, opt: TrainOptions) -> None:
        project = EVOLVE_PROJECT if opt.project == TrainOptions().project else opt.project
        self.dir = increment_path(project, opt.name, exist_ok=True)  # also checks the name
        self.csv = self.dir / "evolve.csv"
        self.base_hyp = load_hyp(opt.hyp)

    def claim(self, opt: TrainOptions) -> None:
        """Record the command on the first start; on a rerun, refuse a command that trains something else."""
        saved_opt, saved_hyp = self.dir / "opt.yaml", self.dir / "hyp_base.yaml"
        given = {k: v for k, v in as_dict(opt).items() if k not in FREE_ON_RERUN}
        if not saved_opt.exists():
            if self.csv.exists():
                raise UserError(f"{self.csv} has no opt.yaml beside it: not a search this train.py started; "
                                f"give the search another --name")
            save_yaml(given, saved_opt, header="The command of this search (train.py --evolve); a rerun must match")
            save_yaml(self.base_hyp.as_dict(), saved_hyp, header=f"{opt.hyp} when this search started")
            return
        saved = load_yaml(saved_opt, "search options")
        fix = "rerun that search's own command to continue it, or give this one another --name"
        for k, v in given.items():
            if saved.get(k, v) != v:  # an option newer than the search's opt.yaml: its default then
                raise UserError(f"{self.dir} holds a search with --{k.replace('_', '-')} {saved.get(k)!r}, not "
                                f"{v!r}; {fix}")
        if load_yaml(saved_hyp, "hyperparameter file") != self.base_hyp.as_dict():
            raise UserError(f"{opt.hyp} has changed since the search in {self.dir} started (it started from "
                            f"{saved_hyp}); {fix}")

    def read(self) -> tuple[tuple[str, ...], list[dict[str, float]]]:
        """The genes (evolve.csv's columns after FIXED_COLUMNS) and the finished generations, in order."""
        if not self.csv.exists():
            return (), []
        from utils.report.results import read_table

        fix = "remove its rows from the first bad one on (the search redoes them), or give the search another --name"
        try:
            header, data = read_table(self.csv)
        except (OSError, ValueError) as e:
            raise UserError(f"{self.csv} cannot be read ({e}); {fix}") from None
        genes = tuple(header[len(FIXED_COLUMNS):])
        if tuple(header[:len(FIXED_COLUMNS)]) != FIXED_COLUMNS or not genes or not set(genes) <= set(GENES):
            raise UserError(f"{self.csv} does not have the columns of a search this train.py started; {fix}")
        rows = [dict(zip(header, map(float, r))) for r in data]
        for g, r in enumerate(rows):
            values = np.array([r[k] for k in genes])
            if r["generation"] != g or not np.isfinite(values).all() or not np.isfinite(r["fitness"]):
                raise UserError(f"{self.csv}: row {g + 1} is not generation {g} with finite values; {fix}")
        return genes, rows

    def write(self, genes: tuple[str, ...], rows: list[dict[str, float]]) -> None:
        """evolve.csv, rewritten whole and atomically: a kill mid-write leaves the previous file. Values as
        repr() writes them, which reads back to the same float: a continued search selects and mutates exactly
        the numbers an uninterrupted one had in memory."""
        columns = (*FIXED_COLUMNS, *genes)
        lines = [",".join(columns)] + [",".join(str(int(r[c])) if c == "generation" else repr(float(r[c]))
                                                for c in columns) for r in rows]
        atomic_write(self.csv, lambda f: f.write(("\n".join(lines) + "\n").encode()))

    def generation_dir(self, g: int) -> Path:
        return self.dir / f"gen{g:03d}"

    def hyp_of(self, values: dict[str, float]) -> dict:
        return {**self.base_hyp.as_dict(), **values}

    def write_best(self, opt: TrainOptions, genes: tuple[str, ...], rows: list[dict[str, float]]) -> int:
        """hyp_evolve.yaml from the fittest generation so far (returned), whose weights are the only ones kept."""
        best = int(np.argmax([r["fitness"] for r in rows]))  # the first of equals
        r = rows[best]
        save_yaml(self.hyp_of({k: r[k] for k in genes}), self.dir / "hyp_evolve.yaml", header=(
            f"The fittest of {len(rows)} generations in {self.dir} (python train.py --evolve): generation {best}, "
            f"fitness {r['fitness']:.4f}\n(mAP@0.5 {r['metrics/mAP_0.5']:.4f}, mAP@0.5:0.95 "
            f"{r['metrics/mAP_0.5:0.95']:.4f}) with the options in {self.dir / 'opt.yaml'}.\n"
            f"It is the --hyp that generation was given ({opt.hyp} with the evolved values), so the recipe\n"
            f"fits it to the next run's batch, schedule and classes; {self.generation_dir(best) / 'hyp.yaml'} "
            f"repeats the generation exactly.\n"
            f"Evolved: {', '.join(genes)}."))
        for g in range(len(rows)):  # a missing folder costs one failed lookup
            if g != best:
                shutil.rmtree(self.generation_dir(g) / "weights", ignore_errors=True)
        return best

    def plot(self) -> None:
        from utils.report.plots import plot_evolve  # matplotlib only when there is something to draw

        plot_evolve(self.csv)


# ----------------------------------------------------------------------------------------------- one generation
class RunOutcome(Protocol):  # train.Outcome: utils/ never imports train.py, which hands its train() in
    save_dir: Path
    best_fitness: float
    interrupted: bool


class TrainFn(Protocol):  # train.train
    def __call__(self, opt: TrainOptions, callbacks: Callbacks, interrupt_line: str | None = None) -> RunOutcome: ...


@dataclass
class Observed:
    """What a generation's run reports through its callbacks: its recipe and batches (which genes matter), its
    final epoch's results.csv row (the metrics), and whether it had to reload after non-finite weights."""

    recipe: Recipe | None = None
    batches: int = 0
    epochs: int = 0
    row: dict | None = None
    rewound: bool = False

    def callbacks(self) -> Callbacks:
        cb = Callbacks()
        cb.register("on_train_start", self._start)
        cb.register("on_epoch_end", lambda t, epoch, row: setattr(self, "row", row))
        cb.register("on_rewind", lambda t: setattr(self, "rewound", True))
        return cb

    def _start(self, t) -> None:
        self.recipe, self.batches, self.epochs = t.recipe, len(t.train_loader), t.s.epochs


def generation_options(opt: TrainOptions, folder: SearchFolder, g: int, hyp_file: Path) -> TrainOptions:
    """The user's options for generation g's run: its folder, its hyp, its own seed; validation after the last
    epoch only and no pictures or intermediate checkpoints (YOLOv5's evolve does the same)."""
    return replace(opt, evolve=None, resume=False, hyp=str(hyp_file), project=str(folder.dir),
                   name=folder.generation_dir(g).name, exist_ok=True, seed=opt.seed + g, noval=True, nosave=True,
                   noplots=True, save_period=-1)


def run_generation(opt: TrainOptions, folder: SearchFolder, g: int, values: dict[str, float],
                   train: TrainFn) -> tuple[RunOutcome | None, Observed]:
    """Train generation g (values: its genes; none for generation 0, which trains the base hyp). Returns the
    outcome, None when the weights turned non-finite for good (a hyp that diverges: fitness 0, and the search
    goes on; any other error stops the search, as it would stop every generation)."""
    gen_dir = folder.generation_dir(g)
    if gen_dir.exists():  # a generation cut short: it starts again, and repeats itself (seeded)
        shutil.rmtree(gen_dir)
    gen_dir.mkdir(parents=True)
    hyp_file = gen_dir / "hyp_given.yaml"
    save_yaml(folder.hyp_of(values), hyp_file, header=f"Generation {g} of the search in {folder.dir}: "
              f"{opt.hyp}" + (" with the evolved values of its evolve.csv row" if values else ", as given"))
    seen = Observed()
    # an interrupted generation is trained again by the search's own command: --resume of its last.pt would train
    # that generation alone and never record it in evolve.csv
    line = (f"generation {g} of the search in {folder.dir} stopped; continue the search with: "
            f"{command_line('train.py', opt)}")
    try:
        return train(generation_options(opt, folder, g, hyp_file), seen.callbacks(), interrupt_line=line), seen
    except UserError as e:
        if not seen.rewound or seen.recipe is None:
            raise
        LOGGER.warning(f"generation {g}: {e}; recorded with fitness 0")
        return None, seen


def record(g: int, outcome: RunOutcome | None, seen: Observed, values: dict[str, float]) -> dict[str, float]:
    """Generation g's evolve.csv row."""
    metrics = [float((seen.row or {}).get(k, 0.0)) for k in METRICS] if outcome is not None else [0.0] * 4
    fitness = max(outcome.best_fitness, 0.0) if outcome is not None else 0.0
    return {"generation": g, "fitness": fitness, **dict(zip(METRICS, np.nan_to_num(metrics).tolist())), **values}


# ----------------------------------------------------------------------------------------------- the search
@dataclass
class SearchOutcome:
    save_dir: Path
    best_fitness: float
    interrupted: bool = False


def check_evolve_options(opt: TrainOptions) -> None:
    check_rules(((opt.evolve is not None and opt.evolve >= 1, f"--evolve {opt.evolve} must be 1 or more generations"),
                 (not opt.resume, "--evolve continues a search when its command is run again (evolve.csv is its "
                                  "state); drop --resume, which continues a single run"),
                 (dist_info().world_size == 1, "--evolve trains its generations one after another in one process; "
                                               "start it with python train.py, not torchrun")))


def next_values(rows: list[dict[str, float]], genes: tuple[str, ...], seed: int, g: int) -> dict[str, float]:
    """Generation g's genes: a parent drawn from the finished generations, mutated; none for generation 0."""
    if not rows:
        return {}
    rng = generation_rng(seed, g)
    return mutate(select_parent(rows, genes, rng), genes, rng)


def evolve(opt: TrainOptions, train: TrainFn) -> SearchOutcome:
    """The search of `opt.evolve` generations in all (see the module's docstring); `train` trains one run
    (train.train)."""
    check_evolve_options(opt)
    folder = SearchFolder(opt)
    with RunLock(folder.dir):
        folder.claim(opt)
        genes, rows = folder.read()
        if rows:
            LOGGER.info(f"evolve: {len(rows)} of {opt.evolve} generations done in {folder.csv}; continuing")
        try:  # a stop between two generations (Ctrl-C, SIGTERM, SIGHUP) ends the search as one inside a run does
            with StopSignals():
                return search(opt, folder, genes, rows, train)
        except KeyboardInterrupt:  # evolve.csv holds the generations done
            return conclude(opt, folder, folder.read()[1], interrupted=True)


def search(opt: TrainOptions, folder: SearchFolder, genes: tuple[str, ...], rows: list[dict[str, float]],
           train: TrainFn) -> SearchOutcome:
    """The generations still missing, one after another; `rows` grows with each one done."""
    for g in range(len(rows), opt.evolve):
        values = next_values(rows, genes, opt.seed, g)
        LOGGER.info(f"evolve: generation {g} of {opt.evolve} in {folder.generation_dir(g)}")
        outcome, seen = run_generation(opt, folder, g, values, train)
        if outcome is not None and outcome.interrupted:
            return conclude(opt, folder, rows, interrupted=True)
        if not genes:  # generation 0: its recipe says what matters
            genes = genes_for(seen.recipe, opt.optimizer, folder.base_hyp, opt.rect, seen.batches, seen.epochs)
            values = base_values(folder.base_hyp, seen.recipe, genes)
            LOGGER.info(f"evolve: {seen.recipe.optimizer} recipe (--optimizer {opt.optimizer}); evolving "
                        f"{', '.join(genes)}")
        rows.append(record(g, outcome, seen, values))
        folder.write(genes, rows)
        best = folder.write_best(opt, genes, rows)
        LOGGER.info(f"evolve: generation {g} fitness {rows[-1]['fitness']:.4f}; the fittest so far: generation "
                    f"{best} ({rows[best]['fitness']:.4f})")
    return conclude(opt, folder, rows, interrupted=False)


def conclude(opt: TrainOptions, folder: SearchFolder, rows: list[dict[str, float]], interrupted: bool) -> SearchOutcome:
    """evolve.png, and a line on where things stand."""
    if not rows:
        LOGGER.info(f"evolve: interrupted in generation 0; the same command starts it again: "
                    f"{command_line('train.py', opt)}")
        return SearchOutcome(folder.dir, -1.0, interrupted)
    folder.plot()
    best = int(np.argmax([r["fitness"] for r in rows]))
    how = f"{len(rows)} generations done" if not interrupted else \
        f"interrupted after {len(rows)} of {opt.evolve} generations (continue with: {command_line('train.py', opt)})"
    LOGGER.info(f"evolve: {how}. Fittest: generation {best}, {rows[best]['fitness']:.4f} (generation 0, the given "
                f"hyp: {rows[0]['fitness']:.4f}); train with it: python train.py --hyp "
                f"{folder.dir / 'hyp_evolve.yaml'} (evolve.csv, evolve.png beside it)")
    return SearchOutcome(folder.dir, rows[best]["fitness"], interrupted)
