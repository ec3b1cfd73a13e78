"""A run's configuration (Setup), resolved once by `setup` from the options, the data YAML, the hyperparameter file
and the built model: train.py's first step. The batch is decided in one place (decide_batch)."""
from __future__ import annotations

import atexit
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from utils.data.data_config import load_data_config
from utils.data.labels import list_image_files
from utils.device import resolve_augment_on, select_device
from utils.engine.amp import Precision, amp_check, resolve_precision
from utils.engine.autobatch import resolve_batch_size
from utils.engine.dist import DistInfo, broadcast_flag, dist_info, init_process_group
from utils.engine.optim import Recipe, choose_recipe
from utils.engine.rng import seed_everything
from utils.engine.train_options import TrainOptions, check_options, earlier_threads
from utils.errors import UserError
from utils.files import RunLock, increment_path, remove_empty_tree
from utils.hyp import Hyp, load_hyp
from utils.inference import round_imgsz
from utils.limits import check_imgsz
from utils.options import as_dict

LOGGER = logging.getLogger("train")
MAX_STRIDE = 32  # largest stride of the P5 models: the training size must be a multiple of it


@dataclass(frozen=True)
class Setup:
    """The resolved configuration of a run, built once by `setup` (after AutoBatch and the recipe rule have spoken)
    and never replaced: what opt.yaml and last.pt record (`saved_options`) and a resume reads back."""

    opt: TrainOptions  # as given
    info: DistInfo
    device: torch.device
    data: dict
    hyp: Hyp
    epochs: int
    imgsz: int
    batch_size: int  # the total over all processes, as decide_batch settled it
    save_dir: Path
    names: list[str]
    n_images: int  # training images listed (before verification leaves any out)
    augment_on: str  # --augment-on resolved: "host" or "device" (utils/data/device_augment.py)
    precision: Precision
    recipe: Recipe  # the optimizer and its numbers (utils/engine/optim.choose_recipe)
    cpu_threads_before: tuple[int, ...] = ()  # a resumed run's earlier CPU thread counts, where they differ (resume)

    @property
    def batch_per_process(self) -> int:
        return self.batch_size // self.info.world_size

    def saved_options(self) -> dict:
        """The options with what was resolved (epochs, imgsz, batch size, run folder): opt.yaml, and last.pt's
        record, so a resume trains with the same numbers (and never profiles again). Also what else the arithmetic
        depends on (README "Reproducible runs"): the CPU threads and the torch version, which a rerun or a resume
        must match to repeat the run bit for bit (check_resume_environment)."""
        return {**as_dict(self.opt), "epochs": self.epochs, "imgsz": self.imgsz, "batch_size": self.batch_size,
                "save_dir": str(self.save_dir), "cpu_threads": torch.get_num_threads(), "torch": str(torch.__version__),
                "augment_on": self.augment_on,
                **({"cpu_threads_before": list(self.cpu_threads_before)} if self.cpu_threads_before else {})}


def setup(opt: TrainOptions, make_model: Callable[[TrainOptions, list[str]], tuple[nn.Module, Any]],
          held: contextlib.ExitStack | None = None, resume_ckpt: dict | None = None) -> tuple[Setup, nn.Module]:
    """The run's Setup and its model (on the device, --freeze applied): options, process group, data,
    hyperparameters and the run folder, locked for this run (RunLock) on rank 0 (`held` releases the lock when the
    run ends; without it, when the process exits); then the model (`make_model(opt, names)`: the model and what
    transferred from --weights, None from scratch; train.create_model), its precision, the batch and the recipe."""
    check_options(opt)
    info = dist_info()
    device = select_device(opt.device)
    init_process_group(info, device)
    if opt.batch_size != -1 and opt.batch_size % info.world_size:
        raise UserError(f"--batch-size {opt.batch_size} must be a multiple of the {info.world_size} processes")
    data = load_data_config(opt.data)
    hyp = load_hyp(opt.hyp)
    defaults = data.get("defaults") or {}
    epochs = opt.epochs or int(defaults.get("epochs", 300))
    imgsz = round_imgsz(opt.imgsz or int(defaults.get("imgsz", 640)), MAX_STRIDE)
    names = ["item"] if opt.single_cls else list(data["names"])
    n_images = len(list_image_files(data["train"]))  # the images only: they are verified when the loader is built
    largest = -(-imgsz * 3 // 2 // MAX_STRIDE) * MAX_STRIDE if opt.multi_scale else imgsz  # multi-scale's largest
    # before anything is built: an input size no machine holds at the batch asked for (a check; decide_batch decides)
    check_imgsz((largest, largest), max(batch_for_data(opt.batch_size, n_images, info.world_size) // info.world_size,
                                        1), training=True, device=device)
    save_dir = run_folder(opt, info, held)
    augment_on = resolve_augment_on(opt.augment_on, device)
    seed_everything(opt.seed)
    model, transfer = make_model(opt, names)
    # channels_last: oneDNN's fast bf16 convolutions (and cuDNN's tensor-core kernels) want NHWC
    model = model.to(device, memory_format=torch.channels_last)
    prepare_layers(opt, imgsz, model, transfer)
    precision = choose_precision(opt.amp, device, hyp, info, model)
    recipe = decide_batch(opt, hyp, device, info, model, precision, transfer, n_images, epochs, imgsz, augment_on,
                          len(names))
    before = earlier_threads(resume_ckpt["train"]["opt"]) if resume_ckpt is not None else ()
    return Setup(opt, info, device, data, hyp, epochs, imgsz, recipe.batch_size, save_dir, names, n_images, augment_on,
                 precision, recipe, before), model


def decide_batch(opt: TrainOptions, hyp: Hyp, device: torch.device, info: DistInfo, model: nn.Module,
                 precision: Precision, transfer: Any, n_images: int, epochs: int, imgsz: int,
                 augment_on: str, nc: int) -> Recipe:
    """The one place the batch is decided, in this order: a batch larger than the training set is cut to it (one
    line), --batch-size -1 takes AutoBatch's choice for this model under this precision (16 on a CPU, one line), and
    the recipe rule may lower it to give a short run its steps (choose_recipe's step floor). Returns the recipe, whose
    batch_size is the run's; a resume reads that batch back from last.pt and the rule leaves it."""
    batch = batch_for_data(opt.batch_size, n_images, info.world_size)
    if batch < opt.batch_size:
        LOGGER.info(f"--batch-size {opt.batch_size} is more than the {n_images} training images; training at batch "
                    f"{batch}, the whole set in each step")
    if batch == -1:
        batch = resolve_batch_size(-1, device, model, imgsz, info.world_size, autocast=precision.autocast,
                                   n_images=n_images, augment_on=augment_on, mixup=hyp.mixup > 0)
    return choose_recipe(opt.optimizer, hyp, batch, n_images, epochs, nc,
                         transfer.share if transfer is not None else 0.0, info.world_size)


# ----------------------------------------------------------------------------------------------- the model
def freeze_layers(model: nn.Module, freeze: list[int], transfer: Any) -> None:
    """--freeze N: the first N modules get no gradient (YOLOv5's backbone is 0-9); --freeze a b c: those modules.
    A module the model does not have is refused; frozen tensors that did not come from --weights are said, as
    they will never learn."""
    n = len(model.model)
    layers = range(freeze[0]) if len(freeze) == 1 else freeze
    missing = [i for i in layers if not 0 <= i < n]
    if len(freeze) > 1 and missing:
        raise UserError(f"--freeze {' '.join(map(str, freeze))}: {model.name} has modules 0-{n - 1}, not "
                        f"{', '.join(map(str, missing))}; --freeze N freezes the first N (10: the backbone)")
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = [k for k, p in model.named_parameters() if k.startswith(prefixes)]
    for k, p in model.named_parameters():
        p.requires_grad_(not k.startswith(prefixes))
    fresh = [k for k in frozen if transfer is None or k in transfer.fresh]
    if fresh:
        LOGGER.warning(f"warning: --freeze {' '.join(map(str, freeze))} holds {len(fresh)} of its {len(frozen)} tensors "
                       f"at their random start ({'no --weights' if transfer is None else 'not in --weights'}): they "
                       f"will never learn; freeze only layers that come from --weights")


def prepare_layers(opt: TrainOptions, imgsz: int, model: nn.Module, transfer: Any) -> None:
    """--freeze, and the checks that need the built model."""
    freeze_layers(model, opt.freeze, transfer)
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"--freeze {' '.join(map(str, opt.freeze))} freezes every layer: nothing would train; "
                        f"freeze fewer (e.g. --freeze 10 for the backbone)")
    if imgsz % int(model.stride.max()):
        raise UserError(f"--imgsz {imgsz} must be a multiple of the model's largest stride {int(model.stride.max())}")


def choose_precision(amp: str, device: torch.device, hyp: Hyp, info: DistInfo, model: nn.Module) -> Precision:
    """--amp, then the AMP check on the model itself (rank 0 decides for everyone)."""
    precision = resolve_precision(amp, device, hyp)
    if precision.enabled:
        ok = amp_check(model, precision) if info.is_main else True
        if not broadcast_flag(ok, device):
            LOGGER.warning(f"AMP check failed: {precision.mode} autocast changes this model's outputs; training in FP32")
            return Precision("off", device.type)
    LOGGER.info(f"precision: {precision.mode if precision.enabled else 'FP32'} on {device}"
                f"{' with GradScaler' if precision.use_scaler else ''}"
                f"{' (FP32 during the warmup steps)' if precision.fp32_warmup else ''}")
    return precision


def batch_for_data(batch_size: int, n_images: int, world_size: int) -> int:
    """A batch larger than the training set cut to it (a multiple of the processes): the loader could never fill
    it, as in YOLOv5. -1 (AutoBatch) stays."""
    cap = max(n_images - n_images % world_size, world_size)
    if batch_size == -1 or batch_size <= cap or n_images < 1:
        return batch_size
    return cap


def run_folder(opt: TrainOptions, info: DistInfo, held: contextlib.ExitStack | None) -> Path:
    """The run's folder, locked for this run (RunLock) on rank 0. A folder made here is removed again if a start-up
    error leaves it empty (a missing --weights must not push the next run from exp to exp2); --exist-ok into the
    folder of an earlier run says, in one line, that its weights are replaced."""
    if opt.resume:
        save_dir = Path(opt.resume).parent.parent  # <run folder>/weights/last.pt (resolve_resume checked)
    elif not info.is_main:
        return Path(opt.project) / opt.name  # never written by other ranks
    else:
        existed = opt.exist_ok and (Path(opt.project) / opt.name).is_dir()
        save_dir = increment_path(opt.project, opt.name, opt.exist_ok)
        if held is not None and not existed:
            held.callback(remove_empty_tree, save_dir)  # runs after the lock's release (an ExitStack unwinds backwards)
    if held is not None:
        held.enter_context(RunLock(save_dir))
    else:
        atexit.register(RunLock(save_dir).acquire().release)
    earlier = [f for f in ("best.pt", "last.pt") if (save_dir / "weights" / f).exists()]
    if not opt.resume and earlier:
        LOGGER.warning(f"warning: --exist-ok: replacing the weights of an earlier run in {save_dir} "
                       f"({', '.join(earlier)}) and its results.csv; its other files (pictures, epoch checkpoints) "
                       f"stay until this run writes its own")
    return save_dir
