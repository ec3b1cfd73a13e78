"""Train a YOLOv5-architecture detector with native mixed precision.

    python train.py                                   # yolov5n on the built-in shapes dataset
    python train.py --data coco128.yaml --cfg yolov5s.yaml --epochs 100 --imgsz 640
    python train.py --resume                          # continue the latest run exactly
    torchrun --nproc_per_node 2 train.py ...          # DDP (NCCL on CUDA, Gloo on CPU)

The story: set up (options, precision, model, EMA, optimizer, data) -> epochs (train, validate,
log, save) -> finish (strip checkpoints to FP16 EMA, plots). Every concern lives in its own
object: the precision policy (utils/engine/amp.py), the update under AMP (utils/engine/optim.AmpUpdater), the
EMA (utils/engine/ema.py), the checkpoint format (utils/engine/checkpoint.py), the loss (utils/engine/loss.py).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import validator
from models.transfer import Transfer, transfer_weights
from models.yolo import Model
from utils.data.datasets import create_dataloader, loader_failure, stopped_by_signal
from utils.data.device_augment import DeviceAugment
from utils.data.multiscale import rescale_batch, size_for_step
from utils.device import memory_used
from utils.engine.amp import Precision
from utils.engine.autoanchor import check_anchors
from utils.engine.callbacks import Callbacks
from utils.engine.checkpoint import (atomic_save, load_checkpoint, make_checkpoint, remove_stale_temps,
                                     strip_checkpoint)
from utils.engine.diagnostics import COLUMNS as DIAGNOSTICS_COLUMNS, EpochDiagnostics
from utils.engine.dist import barrier, broadcast_flag, de_parallel, destroy, wrap_ddp
from utils.engine.ema import ModelEMA
from utils.engine.faults import faults_from_env
from utils.engine.loss import ComputeLoss, loss_gains
from utils.engine.optim import Recipe, apply_warmup, build_optimizer, lr_lambda, resolved_hyp
from utils.engine.rng import reproducible
from utils.engine.run_setup import Setup, setup
from utils.engine.train_state import load_train_state, rewind_epoch_files, save_train_state
from utils.engine.train_options import (TrainOptions, as_given, check_resume_environment, continue_line, parse_opt,
                                        resolve_resume, set_up_line)
from utils.engine.updater import AmpUpdater
from utils.errors import Interrupted, StopSignals, UserError, run_cli
from utils.files import remove_stale_temps as remove_stale_run_temps, resolve_weights, save_yaml
from utils.report.previews import register_previews
from utils.report.results import COLUMNS as RESULTS_COLUMNS, append_row, read_rows
from utils.report.tblog import register_tensorboard

if TYPE_CHECKING:
    from utils.engine.evolve import SearchOutcome

LOGGER = logging.getLogger("train")
MAX_REPLAYS = 3  # reloads of the last good checkpoint after the weights turn non-finite, per epoch
BAR_REFRESH_S = 0.5  # seconds between the progress bar's loss figures (each refresh is a host read of the GPU's)


# ----------------------------------------------------------------------------------------------- model
def create_model(opt: TrainOptions, names: list[str]) -> tuple[nn.Module, Transfer | None]:
    """From --cfg, or from a checkpoint (--weights: ours or YOLOv5's) for fine-tuning, with one line on what
    transferred (models/transfer.py); the Transfer is None from scratch."""
    nc = len(names)
    if not opt.weights:
        return Model(opt.cfg or "yolov5n.yaml", nc=nc), None
    path = resolve_weights(opt.weights)
    ckpt = load_checkpoint(path)
    model = Model(opt.cfg or ckpt["yaml"], nc=nc)
    transfer = transfer_weights(model, ckpt, path)
    LOGGER.info(transfer.describe())
    return model, transfer



# ----------------------------------------------------------------------------------------------- training state
@dataclass
class Trainer:
    """The stateful parts of a run. Each has state_dict/load_state_dict, and resume restores all of them."""

    s: Setup
    model: nn.Module  # possibly DDP-wrapped
    ema: ModelEMA
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    updater: AmpUpdater
    compute_loss: ComputeLoss
    train_loader: Any
    val_loader: Any
    diagnostics: EpochDiagnostics
    augment: DeviceAugment  # a batch to the device; with --augment-on device, the warp, HSV and flips there too
    stops: StopSignals  # the run's stop signals (utils/errors.py): checked after every batch and epoch
    start_epoch: int = 0
    best_fitness: float = -1.0
    best_epoch: int = -1
    elapsed: float = 0.0  # seconds spent in finished epochs (training, validation, saving), over every process
    clock_mark: float = 0.0  # time.time() when `elapsed` was last brought up to date
    replays: dict[int, int] = field(default_factory=dict)  # epoch -> reloads after non-finite weights
    callbacks: Callbacks = field(default_factory=Callbacks)  # observers of the loop (utils/engine/callbacks.py)
    finished: bool = False  # last.pt is stripped: training is complete (finish)
    schedule_batches: int = 0  # batches an epoch counts in the warmup (a resume keeps its run's); 0: the loader's

    @property
    def precision(self) -> Precision:
        return self.s.precision

    @property
    def recipe(self) -> Recipe:  # accumulation, momentum and warmup (utils/engine/optim.choose_recipe)
        return self.s.recipe

    @property
    def batches_per_epoch(self) -> int:
        return self.schedule_batches or len(self.train_loader)

    def save(self, ckpt: dict, path: Path) -> None:
        """An atomic checkpoint write; before_save callbacks run between its temp file and the rename."""
        atomic_save(ckpt, path, lambda: self.callbacks.fire("before_save", self, path))

    def train_state(self, epoch: int) -> dict:
        return save_train_state(self, epoch)  # utils/engine/train_state.py: one entry per part

    def load_train_state(self, ckpt: dict) -> None:
        load_train_state(self, ckpt["train"])

    def check_same_data(self, ckpt: dict, resume: str) -> None:
        """A resumed run whose training set changed keeps its recorded schedule, and says so in one line."""
        then, now = ckpt["train"].get("pictures"), len(self.train_loader.dataset)
        if then is not None and then != now:
            LOGGER.warning(f"warning: --resume {resume}: the training set has {now:,} pictures now, {then:,} when the "
                           f"run started; the run keeps its schedule ({self.batches_per_epoch} batches an epoch). To "
                           f"train on the new data, start a new run from its weights (--weights {resume})")

    def weights_finite(self) -> bool:
        """Once per epoch: are the model's and the EMA's weights all finite? (rank 0 decides for all)"""
        params = [*de_parallel(self.model).parameters(), *self.ema.ema.parameters()]
        finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
        return broadcast_flag(finite, self.s.device)


def build_trainer(s: Setup, model: nn.Module, resume_ckpt: dict | None, stops: StopSignals) -> Trainer:
    r = s.recipe
    train_loader, val_loader = build_loaders(s, int(model.stride.max()))
    if resume_ckpt is None and not getattr(s.opt, "noautoanchor", False):  # a resumed run keeps last.pt's anchors
        ds = train_loader.dataset
        check_anchors(model, ds.shapes, ds.labels, s.imgsz, s.hyp.anchor_t, s.opt.seed)
    weight_decay = r.weight_decay(s.hyp)
    optimizer = build_optimizer(model, r.optimizer, r.lr0, r.momentum, weight_decay, fused=s.device.type == "cuda")
    if s.info.is_main:
        LOGGER.info(r.describe(s.hyp, len(train_loader), s.epochs))
        if r.note:
            LOGGER.warning(r.note)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(s.epochs, s.hyp.lrf, s.opt.cos_lr))
    ema = ModelEMA(model, tau=r.ema_tau)  # on every rank (DDP keeps the weights equal); only rank 0's is saved
    model = wrap_ddp(model, s.info, s.device, s.opt.sync_bn)
    nl = de_parallel(model).model[-1].nl
    gains = loss_gains(s.hyp, nl, len(s.names), s.imgsz, r.cls_by_nc, r.box_gain)
    compute_loss = ComputeLoss(model, gains, s.opt.label_smoothing)
    diagnostics = EpochDiagnostics()
    trainer = Trainer(s, model, ema, optimizer, scheduler,
                      AmpUpdater(model, optimizer, s.precision, ema, r.max_grad_norm, diagnostics), compute_loss,
                      train_loader, val_loader, diagnostics, DeviceAugment(s.hyp, s.device), stops)
    if resume_ckpt is not None:
        trainer.load_train_state(resume_ckpt)
        trainer.check_same_data(resume_ckpt, s.opt.resume)
        LOGGER.info(f"resuming {s.opt.resume} from epoch {trainer.start_epoch} of {s.epochs}")
        check_resume_environment(s.opt.resume, s.device.type, resume_ckpt["train"]["opt"])
    LOGGER.info(de_parallel(model).info(s.imgsz))
    return trainer


def mosaic_epochs(s: Setup) -> int | None:
    """Epochs below this may use mosaics; the last --close-mosaic ones train on whole images, as at test time."""
    return max(s.epochs - s.opt.close_mosaic, 0) if s.opt.close_mosaic > 0 else None


def build_loaders(s: Setup, stride: int):
    """The augmenting training loader (sharded under DDP) and, on rank 0, the rectangular validation loader."""
    train_loader, _ = create_dataloader(
        s.data["train"], s.imgsz, s.batch_per_process, stride, hyp=s.hyp, augment=True, rect=s.opt.rect,
        cache=s.opt.cache, workers=s.opt.workers, shuffle=not s.opt.rect, seed=s.opt.seed, single_cls=s.opt.single_cls,
        rank=s.info.rank, world_size=s.info.world_size, prefix="train: ", nc=s.data["nc"], mosaic_epochs=mosaic_epochs(s),
        augment_on=s.augment_on)
    val_loader = None
    if s.info.is_main:
        val_loader, _ = create_dataloader(
            s.data["val"], s.imgsz, s.batch_per_process * 2, stride, rect=True, pad=0.5,
            cache=s.opt.cache, workers=s.opt.workers, single_cls=s.opt.single_cls, prefix="val: ", nc=s.data["nc"])
    return train_loader, val_loader


# ----------------------------------------------------------------------------------------------- one epoch
def train_one_epoch(t: Trainer, epoch: int) -> torch.Tensor:
    """One pass over the training data; returns the mean box/obj/cls loss of the epoch's finite batches."""
    s, model = t.s, t.model
    model.train()
    t.train_loader.sampler.set_epoch(epoch)
    if s.info.is_main and epoch == mosaic_epochs(s) and not s.opt.rect and s.hyp.mosaic > 0:
        LOGGER.info(f"mosaic off from epoch {epoch} (--close-mosaic {s.opt.close_mosaic})")
    nb, stride = len(t.train_loader), int(de_parallel(model).stride.max())
    nw = t.recipe.warmup_steps(t.batches_per_epoch, s.epochs)
    lr_factor = t.scheduler.lr_lambdas[0](epoch)
    # the epoch's loss sums stay on the device: the host reads them for the bar every BAR_REFRESH_S, not per step
    loss_sum, counted = torch.zeros(3, device=s.device), torch.zeros((), device=s.device)
    shown = -BAR_REFRESH_S
    t.diagnostics.reset()
    bar = progress(t.train_loader, s.info.is_main, nb)
    for i, (imgs, targets, paths, _) in enumerate(bar):
        ni = i + t.batches_per_epoch * epoch
        if ni <= nw:
            apply_warmup(t.optimizer, ni, nw, lr_factor, s.hyp, t.recipe.momentum, t.recipe.warmup_bias_lr)
        imgs, targets = t.augment(imgs, targets)  # to the device (with --augment-on device: warped, coloured there)
        if s.opt.multi_scale:  # a size per (seed, epoch, batch): the same on every rank and after a resume
            imgs = rescale_batch(imgs, size_for_step(s.imgsz, stride, s.opt.seed, epoch, ni), stride)
        t.callbacks.fire("on_train_batch", t, ni, imgs, targets, paths)
        with t.precision.autocast(warmup=ni <= nw):
            loss, items = t.compute_loss(model(imgs), targets.to(s.device, non_blocking=True))
        loss, items = t.callbacks.loss(t, ni, loss, items)
        t.diagnostics.add_batch(t.compute_loss.last_positives, targets.shape[0])
        t.updater.backward(loss * s.info.world_size)  # DDP averages gradients over processes
        if (i + 1) % t.recipe.accumulate == 0 or i == nb - 1:  # no gradients cross an epoch boundary: exact resume
            t.updater.step()
        t.callbacks.fire("on_step_end", t, ni, items)
        t.stops.check()
        finite = torch.isfinite(items).all()
        loss_sum, counted = loss_sum + torch.where(finite, items, 0.0), counted + finite
        if s.info.is_main and (time.monotonic() - shown >= BAR_REFRESH_S or i == nb - 1):
            shown = time.monotonic()
            mloss = (loss_sum / counted.clamp(min=1)).tolist()
            bar.set_description(f"{epoch}/{s.epochs - 1} {memory_used(s.device):>6} " + " ".join(f"{x:8.4g}" for x in mloss)
                                + f" {targets.shape[0]:5d} {imgs.shape[-1]:4d} skipped {t.updater.skipped}")
    return (loss_sum / counted.clamp(min=1)).cpu()


def progress(loader, enabled: bool, total: int):
    if not enabled:
        return loader
    from tqdm import tqdm

    LOGGER.info(f"{'epoch':>5} {'mem':>6} {'box':>8} {'obj':>8} {'cls':>8} {'targets':>5} {'size':>4}")
    return tqdm(loader, total=total, bar_format="{l_bar}{bar:10}{r_bar}")


def validate(t: Trainer, final: bool) -> validator.ValResult:
    """mAP of the FP32 EMA through test.run's live mode (it never casts the EMA in place)."""
    return validator.run(
        data=t.s.data, model=t.ema.ema, dataloader=t.val_loader, batch_size=t.s.batch_per_process * 2, imgsz=t.s.imgsz,
        single_cls=t.s.opt.single_cls, plots=final and not t.s.opt.noplots, save_dir=t.s.save_dir,
        compute_loss=t.compute_loss, verbose=final, half=t.precision.eval_half)


# ----------------------------------------------------------------------------------------------- logging and saving
def log_epoch(t: Trainer, epoch: int, mloss: torch.Tensor, result: validator.ValResult | None, lrs: list[float]) -> None:
    """results.csv and diagnostics.csv (utils/report/results.py, utils/engine/diagnostics.py) get the epoch's row; then
    the on_epoch_end callbacks get it."""
    vloss = result.loss.tolist() if result is not None and result.loss is not None else [float("nan")] * 3
    metrics = [result.mp, result.mr, result.map50, result.map] if result is not None else [float("nan")] * 4
    row = [epoch, round(t.elapsed, 2), *mloss.tolist(), *metrics, *vloss, *lrs, t.updater.skipped]
    fix = f"free disk space, then continue with python train.py --resume {t.s.save_dir / 'weights' / 'last.pt'}"
    append_row(t.s.save_dir / "results.csv", RESULTS_COLUMNS, row, fix)
    append_row(t.s.save_dir / "diagnostics.csv", DIAGNOSTICS_COLUMNS, t.diagnostics.row(epoch, de_parallel(t.model)), fix)
    t.callbacks.fire("on_epoch_end", t, epoch, dict(zip(RESULTS_COLUMNS, row)))


def save_checkpoints(t: Trainer, epoch: int, result: validator.ValResult | None, improved: bool) -> None:
    s = t.s
    wdir = s.save_dir / "weights"
    metrics = {} if result is None else {"precision": result.mp, "recall": result.mr, "mAP_0.5": result.map50,
                                         "mAP_0.5:0.95": result.map, "fitness": result.fitness}
    yaml, data = de_parallel(t.model).yaml, str(s.data["yaml_file"])  # data: what export.py --int8 calibrates on
    final = epoch == s.epochs - 1
    if s.opt.nosave and not final:
        return
    # best.pt first: a kill between the two leaves last.pt one epoch behind, so the resumed run redoes
    # this epoch and writes best.pt again; the other order could leave a best.pt that is never rewritten
    if improved or not (wdir / "best.pt").exists():
        t.save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics, imgsz=s.imgsz, data=data), wdir / "best.pt")
    t.save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics, t.train_state(epoch), s.imgsz, data),
           wdir / "last.pt")
    if s.opt.save_period > 0 and (epoch + 1) % s.opt.save_period == 0:
        t.save(make_checkpoint(t.ema.ema, yaml, s.names, epoch, metrics, imgsz=s.imgsz, data=data),
               wdir / f"epoch{epoch}.pt")


def save_run_config(t: Trainer) -> None:
    """opt.yaml (the options, resolved) and hyp.yaml (the hyperparameters the run trains with, the recipe's
    choices included: --hyp of it repeats the run)."""
    s = t.s
    (s.save_dir / "weights").mkdir(parents=True, exist_ok=True)
    save_yaml(s.saved_options(), s.save_dir / "opt.yaml")
    save_yaml(resolved_hyp(s.hyp, t.recipe), s.save_dir / "hyp.yaml",
              header=f"What this run trained with: {s.opt.hyp} with the recipe's choices for it.\n"
                     f"python train.py --hyp {s.save_dir / 'hyp.yaml'} trains with exactly these numbers.")


# ----------------------------------------------------------------------------------------------- the story
@dataclass
class Outcome:
    """What a run leaves: its folder, the final FP32 EMA (for callers that keep training in-process),
    and how it ended."""

    save_dir: Path
    ema: nn.Module
    best_fitness: float
    interrupted: bool = False


def train(opt: TrainOptions, callbacks: Callbacks | None = None, interrupt_line: str | None = None) -> Outcome:
    """One run. `interrupt_line`: what to print when Ctrl-C or SIGTERM stops it (default: the --resume command;
    utils/engine/evolve.py gives its own command, which continues the search)."""
    t = None
    try:
        # from here on SIGTERM is a Ctrl-C: a clean stop that keeps last.pt; `held` releases the run folder's lock
        with StopSignals() as stops, contextlib.ExitStack() as held:
            opt, resume_ckpt = resolve_resume(opt)
            held.enter_context(reproducible(opt.deterministic, opt.seed))  # utils/engine/rng.py; undone on the way out
            t = build_trainer(*setup(opt, create_model, held, resume_ckpt), resume_ckpt, stops)
            start_run(t, callbacks, held, fresh=resume_ckpt is None)
            try:
                run_epochs(t)
                if t.s.info.is_main:
                    finish(t)
            except KeyboardInterrupt:
                return stopped(t, interrupt_line)
            except (RuntimeError, UserError) as e:
                if stops.requested or stopped_by_signal(e):  # a worker that went down with the stop
                    return stopped(t, interrupt_line)
                failure = loader_failure(e, t.s.save_dir / "weights" / "last.pt")
                if failure is None:
                    raise
                raise failure from None
    except KeyboardInterrupt:  # during set-up, or a second signal while the run stopped: still say how to go on
        line = continue_line(t.s.save_dir, t.finished, interrupt_line) if t is not None else \
            set_up_line(opt, interrupt_line)
        raise Interrupted(line) from None
    destroy()
    return Outcome(t.s.save_dir, t.ema.ema, t.best_fitness)


def start_run(t: Trainer, callbacks: Callbacks | None, held: contextlib.ExitStack, fresh: bool) -> None:
    """The run's observers, then its folder (rank 0) and on_train_start."""
    s = t.s  # the final Setup (with the batch size AutoBatch chose)
    t.callbacks = (callbacks or Callbacks()).copy()  # the run's own observers stay out of the caller's object
    faults_from_env().register(t.callbacks)  # test hook (utils/engine/faults.py): nothing unless AMPYOLO_FAULTS is set
    register_tensorboard(t.callbacks)  # utils/report/tblog.py: rank 0 only, always on
    register_previews(t.callbacks)  # utils/report/previews.py: labels.jpg, train_batch0..2.jpg (not with --noplots)
    held.callback(t.callbacks.fire, "on_train_exit", t)  # on every way out, before the run lock is released
    if s.info.is_main:
        prepare_run_folder(t, fresh)
    t.callbacks.fire("on_train_start", t)
    LOGGER.info(f"training {s.epochs} epochs at {s.imgsz}px, results in {s.save_dir}")


def stopped(t: Trainer, interrupt_line: str | None) -> Outcome:
    """After Ctrl-C, SIGTERM or SIGHUP: the pictures of the epochs that finished and one line on how to continue. A
    second signal meanwhile skips the pictures, never the line; from the line on, signals are let go (one after it
    ended here in a second line from run_cli)."""
    t.stops.requested = False  # so that a signal from here raises: it skips the pictures
    with contextlib.suppress(KeyboardInterrupt, RuntimeError):  # a second signal; a worker that went down with it
        if t.s.info.is_main:
            plot_run(t)
    t.stops.stopped = True
    LOGGER.info(f"interrupted: {continue_line(t.s.save_dir, t.finished, interrupt_line)}")
    destroy()
    return Outcome(t.s.save_dir, t.ema.ema, t.best_fitness, interrupted=True)


def prepare_run_folder(t: Trainer, fresh: bool) -> None:
    """Options beside the run; on resume, clear what a killed process left half-done; a fresh run saves
    its initial state, so an interrupt in epoch 0 leaves a resumable last.pt (and a replay has a start)."""
    s = t.s
    save_run_config(t)
    rewind_epoch_files(s.save_dir, t.start_epoch - 1)
    for p in remove_stale_temps(s.save_dir / "weights"):
        LOGGER.info(f"removed {p}: a checkpoint write cut short by the previous process")
    for p in remove_stale_run_temps(s.save_dir, ("opt.yaml", "hyp.yaml", "results.csv", "diagnostics.csv")):
        LOGGER.info(f"removed {p}: a write cut short by the previous process")  # the folder is ours: RunLock
    if fresh:
        t.save(make_checkpoint(t.ema.ema, de_parallel(t.model).yaml, s.names, -1, {}, t.train_state(-1), s.imgsz),
               s.save_dir / "weights" / "last.pt")


def run_epochs(t: Trainer) -> None:
    s, epoch = t.s, t.start_epoch
    t.clock_mark = time.time()
    while epoch < s.epochs:
        t0 = time.time()
        t.callbacks.fire("on_epoch_start", t, epoch)
        mloss = train_one_epoch(t, epoch)
        t.callbacks.fire("on_train_epoch_end", t, epoch)
        if not t.weights_finite():
            epoch = replay_from_last_good(t, epoch)
            continue
        lrs = [g["lr"] for g in t.optimizer.param_groups]
        t.scheduler.step()
        stop = end_epoch(t, epoch, mloss, lrs, t0) if s.info.is_main else False
        t.stops.check()
        if broadcast_flag(stop, s.device):
            break
        barrier()
        epoch += 1


def end_epoch(t: Trainer, epoch: int, mloss: torch.Tensor, lrs: list[float], t0: float) -> bool:
    """Rank 0, after an epoch: validate, log, save. Returns True to stop early."""
    s = t.s
    final = epoch == s.epochs - 1
    result = validate(t, final) if (not s.opt.noval or final) else None
    fitness = result.fitness if result is not None else -1.0
    improved = fitness > t.best_fitness
    if improved:
        t.best_fitness, t.best_epoch = fitness, epoch
    # the clock runs from the previous update: an epoch's checkpoint writes count in the next epoch's time
    now = time.time()
    t.elapsed, t.clock_mark = t.elapsed + now - t.clock_mark, now
    log_epoch(t, epoch, mloss, result, lrs)
    save_checkpoints(t, epoch, result, improved)
    stop = 0 < s.opt.patience <= epoch - t.best_epoch and result is not None  # 0: never, as in YOLOv5
    LOGGER.info(f"epoch {epoch} done in {time.time() - t0:.1f}s" +
                (f", mAP@0.5 {result.map50:.3f} mAP@0.5:0.95 {result.map:.3f}" if result else ""))
    if stop:
        LOGGER.info(f"early stop: no improvement for {s.opt.patience} epochs (best: epoch {t.best_epoch})")
    return stop


def replay_from_last_good(t: Trainer, epoch: int) -> int:
    """The weights turned non-finite in `epoch`: reload the training state of last.pt (the last good
    epoch, or the initial state) and return the epoch to continue from. After MAX_REPLAYS reloads for
    the same epoch the run stops with a clear message; last.pt is never overwritten with bad weights."""
    last = [str(t.s.save_dir / "weights" / "last.pt")]
    if t.s.info.distributed:  # other ranks do not know the incremented run folder
        torch.distributed.broadcast_object_list(last, src=0)
    last = Path(last[0])
    t.replays[epoch] = t.replays.get(epoch, 0) + 1
    if t.replays[epoch] > MAX_REPLAYS:
        raise UserError(f"the weights became non-finite (NaN/inf) in epoch {epoch} again after {MAX_REPLAYS} reloads "
                        f"of {last}; training stopped. Lower lr0 in {t.s.opt.hyp} or train with --amp off; "
                        f"{last} still holds the last good epoch")
    LOGGER.warning(f"warning: the weights became non-finite (NaN/inf) in epoch {epoch}; reloading {last} and "
                   f"replaying from there (reload {t.replays[epoch]} of at most {MAX_REPLAYS})")
    t.load_train_state(load_checkpoint(last))
    t.callbacks.fire("on_rewind", t)
    if t.s.info.is_main:
        rewind_epoch_files(t.s.save_dir, t.start_epoch - 1)
    return t.start_epoch


def finish(t: Trainer) -> None:
    """Strip both checkpoints to the FP16 EMA and plot the results."""
    wdir = t.s.save_dir / "weights"
    for f in ("last.pt", "best.pt"):
        if (wdir / f).exists():
            strip_checkpoint(wdir / f)
        t.finished = True  # last.pt (the first) is stripped: an interrupt from here on has nothing to resume
    plot_run(t)
    LOGGER.info(f"done: best epoch {t.best_epoch} (fitness {t.best_fitness:.4f}); weights in {wdir}")
    t.callbacks.fire("on_train_end", t)


def plot_run(t: Trainer) -> None:
    """results.png from results.csv (unless --noplots), when an epoch finished."""
    csv = t.s.save_dir / "results.csv"
    if not t.s.opt.noplots and csv.exists() and len(read_rows(csv)) > 1:
        from utils.report.plots import plot_results

        plot_results(csv)


def run(callbacks: Callbacks | None = None, **options) -> Outcome | SearchOutcome:
    """Programmatic entry with the CLI's defaults: train.run(data='data/shapes.yaml', epochs=3, imgsz=128);
    `options` are TrainOptions fields (an unknown one is a TypeError). With evolve=N it runs the search, as
    --evolve does, and returns its outcome (utils/engine/evolve.SearchOutcome); `callbacks` then observe every
    generation's run."""
    return start(TrainOptions(**{k: as_given(v) for k, v in options.items()}), callbacks)


def start(opt: TrainOptions, callbacks: Callbacks | None = None) -> Outcome | SearchOutcome:
    """One run, or with --evolve many short runs of train() (utils/engine/evolve.py): main's and run's dispatch."""
    if opt.evolve is None:
        return train(opt, callbacks)
    from utils.engine.evolve import evolve

    def generation(o: TrainOptions, own: Callbacks, interrupt_line: str | None = None) -> Outcome:
        return train(o, own.merged(callbacks) if callbacks is not None else own, interrupt_line)

    return evolve(opt, generation)


def main(argv: list[str] | None = None) -> None:
    if start(parse_opt(argv)).interrupted:
        raise SystemExit(130)  # as a shell reports a run stopped by Ctrl-C (128 + SIGINT)


if __name__ == "__main__":
    run_cli(main)
