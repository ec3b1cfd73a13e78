"""The resolved configuration of a run (Setup): options, process group, data, hyperparameters and the run folder,
fixed before the model is built; train.py's first step."""
from __future__ import annotations

import atexit
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from utils.data.data_config import load_data_config
from utils.hyp import Hyp, load_hyp
from utils.data.labels import list_image_files
from utils.device import resolve_augment_on, select_device
from utils.engine.amp import Precision
from utils.engine.autobatch import resolve_batch_size
from utils.engine.dist import DistInfo, dist_info, init_process_group
from utils.engine.train_options import TrainOptions, check_options
from utils.errors import UserError
from utils.files import RunLock, increment_path, remove_empty_tree
from utils.inference import round_imgsz
from utils.limits import check_imgsz
from utils.options import as_dict

LOGGER = logging.getLogger("train")
MAX_STRIDE = 32  # largest stride of the P5 models: the training size must be a multiple of it


@dataclass
class Setup:
    """The resolved, fixed configuration of a run: computed in `setup`, never edited afterwards; what opt.yaml and
    last.pt record (`saved_options`) and a resume reads back. --batch-size -1 (AutoBatch) profiles the built model:
    settle_batch_size replaces the Setup with the chosen size before anything reads it (the Trainer's Setup)."""

    opt: TrainOptions  # as given
    info: DistInfo
    device: torch.device
    data: dict
    hyp: Hyp
    epochs: int
    imgsz: int
    batch_size: int  # the total over all processes; -1 only until settle_batch_size
    save_dir: Path
    names: list[str]
    n_images: int = 0  # training images listed (before verification leaves any out)
    augment_on: str = "host"  # --augment-on resolved: "host" or "device" (utils/data/device_augment.py)
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


def setup(opt: TrainOptions, held: contextlib.ExitStack | None = None) -> Setup:
    """Options, process group, data, hyperparameters and the run folder, locked for this run (RunLock) on
    rank 0; `held` releases the lock when the run ends (without it, when the process exits)."""
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
    batch_size = batch_for_data(opt.batch_size, n_images, info.world_size)
    largest = -(-imgsz * 3 // 2 // MAX_STRIDE) * MAX_STRIDE if opt.multi_scale else imgsz  # multi-scale's largest
    check_imgsz((largest, largest), max(batch_size // info.world_size, 1), training=True, device=device)
    save_dir = run_folder(opt, info, held)
    return Setup(opt, info, device, data, hyp, epochs, imgsz, batch_size, save_dir, names, n_images,
                 resolve_augment_on(opt.augment_on, device))


def batch_for_data(batch_size: int, n_images: int, world_size: int) -> int:
    """A batch larger than the training set is cut to it (a multiple of the processes), with one line: the loader
    could never fill it, as in YOLOv5."""
    cap = max(n_images - n_images % world_size, world_size)
    if batch_size == -1 or batch_size <= cap or n_images < 1:
        return batch_size
    LOGGER.info(f"--batch-size {batch_size} is more than the {n_images} training images; training at batch {cap}, "
                f"the whole set in each step")
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


def settle_batch_size(s: Setup, model: nn.Module, precision: Precision) -> Setup:
    """--batch-size -1: AutoBatch's choice for this model under this precision (16 on a CPU, with one line)."""
    if s.batch_size != -1:
        return s
    return replace(s, batch_size=resolve_batch_size(-1, s.device, model, s.imgsz, s.info.world_size,
                                                    autocast=precision.autocast, n_images=s.n_images,
                                                    augment_on=s.augment_on, mixup=s.hyp.mixup > 0))
