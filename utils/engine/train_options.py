"""train.py's options: the TrainOptions dataclass (the command line is built from it), their checks, and
reading them back from a last.pt for --resume (old files included: options newer than the file take
their defaults, unknown old ones are ignored)."""
from __future__ import annotations

import argparse
import logging
import numbers
import os
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from utils.data.data_config import DEFAULT_DATA_FILE
from utils.hyp import DEFAULT_HYP_FILE
from utils.device import AUGMENT_ON
from utils.engine.amp import AMP_MODES
from utils.engine.checkpoint import load_checkpoint
from utils.engine.optim import OPTIMIZERS
from utils.errors import UserError
from utils.inference import check_rules
from utils.options import as_dict, option, parse_options

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOptions:
    """Every option of a run, as given: the command line is built from these fields and run() takes them."""

    data: str = option(str(DEFAULT_DATA_FILE), "dataset YAML (default: the built-in shapes dataset)")
    cfg: str = option("", "model YAML, e.g. yolov5s.yaml (default: yolov5n, or the --weights model)")
    weights: str = option("", "checkpoint to start from, ours or YOLOv5's ('' = from scratch)")
    hyp: str = option(str(DEFAULT_HYP_FILE), "hyperparameter YAML")
    epochs: int | None = option(None, "default: the dataset's suggestion, else 300", type=int)
    batch_size: int = option(16, "total over all processes; -1: AutoBatch, the largest that fits in 60%% of the free "
                             "GPU memory (16 on a CPU)")
    imgsz: int | None = option(None, "train/val size (default: dataset's, else 640)", "--imgsz", "--img", "--img-size",
                               type=int)
    device: str = option("", "cpu, 0, or 0,1 (default: first GPU, else CPU)")
    workers: int = option(8, "max dataloader workers per process")
    amp: str = option("auto", "auto: fp16 on CUDA, else as utils/engine/amp.py decides; fp16 on a CPU is emulated and slow",
                      choices=AMP_MODES)
    optimizer: str = option("auto", "auto: the recipe rule's choice (SGD fine-tuning from --weights, AdamW from scratch, "
                                    "at every run length); or name one for "
                                    "YOLOv5's recipe with it", choices=OPTIMIZERS)
    cos_lr: bool = option(False, "cosine LR schedule")
    label_smoothing: float = option(0.0, "class target smoothing: 1 - e/2 for the class, e/2 for the others")
    patience: int = option(100, "stop after this many epochs without improvement (0: never stop early)")
    freeze: list = option([0], "freeze the first N layers, or the listed layers")
    resume: bool | str = option(False, "resume the latest run, or the given last.pt", nargs="?", const=True)
    evolve: int | None = option(None, "evolve the hyperparameters over N generations of runs with these options "
                                "(N default 300; results in runs/evolve/<name>; the same command again continues "
                                "the search)", type=int, nargs="?", const=300)
    nosave: bool = option(False, "only save the final checkpoint")
    noval: bool = option(False, "only validate after the final epoch")
    noplots: bool = option(False, "no pictures: labels.jpg, train/val batches, results.png, curves")
    cache: str = option("auto", "ram: keep the decoded, resized images in memory; auto (default): do so when they take "
                        "under 2 GB and a quarter of the available memory; off", nargs="?", const="ram")
    augment_on: str = option("auto", "where the random warp, HSV jitter and flips run: host (the loader's workers), "
                             "device (the training device, in batches; the workers only place mosaic tiles; opt-in, "
                             "not yet measured on a GPU), auto: host on every machine", choices=AUGMENT_ON)
    rect: bool = option(False, "rectangular training batches (no mosaic)")
    multi_scale: bool = option(False, "train each batch at a random size in [0.5, 1.5] x imgsz, a multiple of the "
                               "stride (validation stays at imgsz)")
    close_mosaic: int = option(0, "train the last N epochs on whole images, without mosaic (default 0: mosaic to the end)")
    noautoanchor: bool = option(False, "keep the model's anchors (no AutoAnchor check)")
    single_cls: bool = option(False, "train every class as one")
    sync_bn: bool = option(False, "SyncBatchNorm under DDP")
    seed: int = option(0, "seed of every random choice (weights, batches, augmentation)")
    deterministic: bool = option(True, "deterministic algorithms: the same command gives the same weights, bit for "
                                 "bit, on the same kind of machine with the same CPU thread count and library versions "
                                 "(--no-deterministic lifts that; README 'Reproducible runs' gives the cost)",
                                 action=argparse.BooleanOptionalAction)
    save_period: int = option(-1, "also keep epoch{N}.pt every N epochs")
    project: str = option("runs/train", "results go to project/name")
    name: str = option("exp", "run folder name (exp, exp2, ... unless --exist-ok)")
    exist_ok: bool = option(False, "reuse project/name instead of incrementing")


# flags of YOLOv5's train.py this one does not take, with what to do instead
YOLOV5_ONLY = {"--quad": "not implemented (YOLOv5 itself calls it experimental)",
               "--image-weights": "not implemented; sampling follows the seeded sampler",
               "--bucket": "nothing uploads or downloads here", "--upload_dataset": "nothing uploads or downloads here",
               "--bbox_interval": "no experiment-tracker integrations; TensorBoard logs every run",
               "--artifact_alias": "no experiment-tracker integrations; TensorBoard logs every run",
               "--entity": "no experiment-tracker integrations; TensorBoard logs every run",
               "--ndjson-console": "results.csv and TensorBoard hold the metrics",
               "--ndjson-file": "results.csv and TensorBoard hold the metrics",
               "--local_rank": "start several processes with torchrun, which passes the rank by environment",
               "--local-rank": "start several processes with torchrun, which passes the rank by environment"}


def parse_opt(argv: list[str] | None = None) -> TrainOptions:
    return parse_options(TrainOptions, argv, "Train a YOLOv5-architecture detector with native AMP", YOLOV5_ONLY)


def resolve_resume(opt: TrainOptions) -> tuple[TrainOptions, dict | None]:
    """For --resume: the saved options of that run and its checkpoint; otherwise (opt, None)."""
    if not opt.resume:
        return opt, None
    path = Path(opt.resume) if isinstance(opt.resume, str) else latest_run(opt.project)
    ckpt = load_checkpoint(path)
    if "train" not in ckpt:
        raise UserError(f"{path} is from a finished run (stripped to its EMA weights): nothing to resume; "
                        f"to train further start a new run with --weights {path}")
    if path.parent.name != "weights":
        raise UserError(f"--resume {path}: a run's last.pt lives in <run folder>/weights/; resume it there "
                        f"(the run continues in that folder)")
    # the run continues in the folder that holds last.pt (setup), never in a folder named inside the file: a
    # crafted last.pt could otherwise send the output anywhere, past the --name rule of increment_path
    saved = TrainOptions(**saved_options(ckpt["train"]["opt"], path))
    ignored = ignored_on_resume(opt, saved)
    if ignored:
        LOGGER.warning(f"warning: --resume continues {path} as it was started; ignored: {', '.join(ignored)}. The lr "
                       f"schedule, warmup and EMA ramp were set by the run's epochs and batch, so a changed run would "
                       f"not be the run it continues; for other settings start a new run: --weights {path}")
    return replace(saved, resume=str(path), device=opt.device, workers=opt.workers), ckpt


def check_resume_environment(resume: str, device_type: str, saved: dict) -> None:
    """One line when a resume cannot repeat the run bit for bit: on a CPU the sums inside convolutions and
    reductions split over the intra-op threads, so another thread count (or another torch) rounds differently."""
    threads, version = saved.get("cpu_threads"), saved.get("torch")
    if device_type == "cpu" and isinstance(threads, int) and threads != torch.get_num_threads():
        LOGGER.warning(f"warning: {resume} trained with {threads} CPU threads and continues with "
                       f"{torch.get_num_threads()}: the rest of the run rounds differently from the run it continues "
                       f"(set OMP_NUM_THREADS={threads} to continue it exactly)")
    if isinstance(version, str) and version != str(torch.__version__):
        LOGGER.warning(f"warning: {resume} trained with torch {version} and continues with {torch.__version__}: "
                       f"the rest of the run may round differently from the run it continues")


def earlier_threads(saved: dict) -> tuple[int, ...]:
    """The CPU thread counts a resumed run trained with before this process, where they differ from its own: opt.yaml
    records them beside this process's `cpu_threads`."""
    before = [n for n in saved.get("cpu_threads_before", []) if isinstance(n, int)]
    last = saved.get("cpu_threads")
    if isinstance(last, int) and last != torch.get_num_threads():
        before.append(last)
    return tuple(before)


def set_up_line(opt: TrainOptions, interrupt_line: str | None) -> str:
    """How to go on after a stop during set-up, before the run has a folder of its own."""
    if interrupt_line:
        return interrupt_line
    if opt.resume:
        last = opt.resume if isinstance(opt.resume, str) else ""
        return f"the run is as it was; continue with: python train.py --resume {last}".rstrip()
    return "the run had not started training, nothing was kept: start it again"


def continue_line(save_dir: Path, finished: bool, interrupt_line: str | None) -> str:
    """How to go on after a stop: the caller's line (--evolve's), else the --resume command (or, once last.pt is
    stripped, that training is complete)."""
    last = save_dir / "weights" / "last.pt"
    if interrupt_line:
        return interrupt_line
    if finished:
        return f"training had finished, only the wrapping up (pictures) was cut short; the weights are in {last.parent}"
    if not last.exists():  # stopped while the run folder was being prepared
        return f"the run had not started training; nothing to resume in {save_dir}: start it again"
    return f"{last} holds the last finished epoch; continue with: python train.py --resume {last}"


def ignored_on_resume(given: TrainOptions, saved: TrainOptions) -> list[str]:
    """The options given with --resume (those not at their defaults) that differ from the run's, as '--flag value
    (the run's: value)'; --device and --workers are taken from the command line."""
    defaults = TrainOptions()
    out = []
    for key, v in as_dict(given).items():
        if key in SKIP_ON_RESUME or v == getattr(defaults, key) or v == getattr(saved, key):
            continue
        out.append(f"--{key.replace('_', '-')} {_shown(v)} (the run's: {_shown(getattr(saved, key))})")
    return out


def _shown(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, list) else str(v)[:80]


RESUME_NEEDS = ("data", "cfg", "weights", "hyp", "epochs", "batch_size", "imgsz", "amp", "optimizer", "seed",
                "single_cls", "rect")  # options no resume can guess: a last.pt without them is refused
SKIP_ON_RESUME = ("resume", "device", "workers")  # taken from the command line or the path


def saved_options(saved: Any, path: Path) -> dict:
    """The options a last.pt saved, checked against this train.py's: the ones a resume needs present, each
    of the type (and among the choices) the command line would give; options newer than the file take
    their defaults. One UserError line naming the first problem."""
    fix = f"use another last.pt, or start a new run with --weights {path}"
    if not isinstance(saved, dict) or not all(isinstance(k, str) for k in saved):
        raise UserError(f"--resume {path}: its saved options are not a mapping of option names; {fix}")
    missing = [k for k in RESUME_NEEDS if k not in saved]
    if missing:
        raise UserError(f"--resume {path}: its saved options lack {', '.join(missing)}; {fix}")
    defaults = as_dict(TrainOptions())
    out = {**defaults, "augment_on": "host"}  # a run from before --augment-on augmented on the host: it goes on so
    for key, default in defaults.items():
        if key in SKIP_ON_RESUME or key not in saved:
            continue
        v = saved[key]
        ok = of_option_type(key, v, default) and (key not in ("epochs", "imgsz") or v is None or v >= 1)
        ok = ok and (key != "amp" or v in AMP_MODES) and (key != "optimizer" or v in OPTIMIZERS) and \
            (key != "augment_on" or v in AUGMENT_ON)
        if not ok:
            raise UserError(f"--resume {path}: saved option {key}={str(v)[:60]!r} is not what train.py takes; {fix}")
        out[key] = v
    return out


def of_option_type(key: str, v: Any, default: Any) -> bool:
    """Whether `v` is of the type the command line gives option `key` (whose default is `default`)."""
    def whole(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if key == "resume":
        return isinstance(v, (bool, str))
    if key == "device":  # train.run(device=0) means --device 0
        return isinstance(v, str) or whole(v)
    if default is None:  # epochs, imgsz, evolve: a whole number, or not given
        return v is None or whole(v)
    if isinstance(default, bool):
        return isinstance(v, bool)
    if isinstance(default, list):
        return isinstance(v, list) and len(v) > 0 and all(whole(x) for x in v)
    if isinstance(default, float):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if isinstance(default, int):
        return whole(v)
    return isinstance(v, str)


TYPE_WORDS = {int: "a whole number", float: "a number", bool: "True or False", str: "text",
              list: "a list of whole numbers"}


def check_types(opt: TrainOptions) -> None:
    """Options given from Python (train.run) of a type the command line would never give: one line each."""
    for f in fields(TrainOptions):
        v, default = getattr(opt, f.name), f.default if f.default is not MISSING else f.default_factory()
        if of_option_type(f.name, v, default):
            continue
        if f.name == "imgsz" and isinstance(v, (list, tuple)):
            raise UserError(f"imgsz={list(v)!r}: training takes one size, the side of its square batches, e.g. "
                            f"imgsz={max(v) if all(isinstance(x, int) for x in v) and v else 640}")
        want = "a whole number" if default is None else TYPE_WORDS.get(type(default), type(default).__name__)
        raise UserError(f"{f.name}={str(v)[:40]!r} must be {want} (the command line's --{f.name.replace('_', '-')})")


def as_given(v: Any) -> Any:
    """A keyword of train.run as the command line would give it: a path as text, a NumPy number as a Python one
    (opt.yaml holds plain values); other types are left for check_types to refuse in one line."""
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, numbers.Number) and not isinstance(v, (bool, int, float)) and hasattr(v, "item"):
        return v.item()
    return v


def latest_run(project: str) -> Path:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:  # a dangling link, a file removed meanwhile
            return -1.0

    runs = sorted(Path(project).glob("*/weights/last.pt"), key=mtime)
    if not runs:
        raise UserError(f"--resume: no last.pt under {project}/*/weights/; name one with --resume path/to/last.pt")
    return runs[-1]


def check_options(opt: TrainOptions) -> None:
    """Numbers a user can get wrong, refused before anything is built, one line each."""
    check_types(opt)
    check_rules(((opt.epochs is None or opt.epochs >= 1, f"--epochs {opt.epochs} must be 1 or more"),
                 (opt.batch_size >= 1 or opt.batch_size == -1,
                  f"--batch-size {opt.batch_size} must be 1 or more, or -1 for AutoBatch"),
                 (opt.imgsz is None or opt.imgsz >= 1, f"--imgsz {opt.imgsz} must be a positive number of pixels"),
                 (opt.workers >= 0, f"--workers {opt.workers} must be 0 or more"),
                 (opt.close_mosaic >= 0, f"--close-mosaic {opt.close_mosaic} must be 0 or more"),
                 (min(opt.freeze) >= 0, f"--freeze {' '.join(map(str, opt.freeze))}: modules are numbered from 0; "
                                        f"--freeze N freezes the first N (10: YOLOv5's backbone)"),
                 (0 <= opt.label_smoothing < 1, f"--label-smoothing {opt.label_smoothing} must lie in [0, 1)"),
                 (opt.patience >= 0, f"--patience {opt.patience} must be 0 or more (0 turns early stopping off)")))
