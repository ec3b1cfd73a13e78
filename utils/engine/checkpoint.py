"""The checkpoint format: plain state dicts that load with `torch.load(..., weights_only=True)`.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts, never pickled modules, so opening
one never runs code. Every file is written atomically (temp file in the same folder, then os.replace):
a crash or a full disk mid-write leaves the previous file intact.

    best.pt / stripped last.pt: {'format', 'version', 'yaml', 'nc', 'names', 'model' (EMA, FP16),
                                 'epoch', 'metrics', 'date'}
    last.pt during training:    the above plus 'train': everything an exact resume needs.
"""
from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from utils import files
from utils.errors import UserError, stops_deferred
from utils.files import atomic_write
from utils.engine.schema import MISSING, SchemaError, field_of, is_int, is_number, plain, require, state_dict_of
from utils.engine.train_state import check_train_state
from utils.limits import MAX_CLASSES, MAX_IMGSZ, TooLarge, check_expanded

FORMAT = "ampyolo"
VERSION = 1


def fp16_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights in FP16 on the CPU (integer buffers such as BN's counters keep their dtype)."""
    return {k: (v.detach().half() if v.is_floating_point() else v.detach()).cpu().clone() for k, v in model.state_dict().items()}


def make_checkpoint(ema_model: nn.Module, yaml: dict, names: list[str], epoch: int,
                    metrics: dict[str, float] | None = None, train_state: dict[str, Any] | None = None,
                    imgsz: int | None = None, data: str | None = None) -> dict[str, Any]:
    """Assemble a checkpoint dict; `train_state` is only given for last.pt during training. `imgsz`, the size the
    weights were trained at, is what test.py and detect.py run at when no --imgsz is given; `data`, the dataset YAML
    it was trained on, is whose training pictures calibrate an INT8 export (export.py --int8) when no --data is given."""
    ckpt = {
        "format": FORMAT,
        "version": VERSION,
        "yaml": yaml,
        "nc": int(yaml["nc"]),
        "names": list(names),
        "model": fp16_state_dict(ema_model),
        "epoch": int(epoch),
        "metrics": dict(metrics or {}),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if imgsz is not None:
        ckpt["imgsz"] = int(imgsz)
    if data is not None:
        ckpt["data"] = str(data)
    if train_state is not None:
        ckpt["train"] = train_state
    return ckpt


def atomic_save(obj: Any, path: str | Path, before_replace: Callable[[], None] | None = None) -> None:
    """torch.save through the project's one atomic writer (utils.files.atomic_write): temp file beside
    `path`, fsync, rename. On any failure (a full disk shows up as OSError or as torch's zip-writer
    RuntimeError) the file already at `path` is kept and the user gets one line."""
    with stops_deferred():  # a stop waits for the write: torch.save cut inside its writer can abort
        atomic_write(path, lambda f: torch.save(obj, f), fix="Free disk space or choose another --project",
                     before_replace=before_replace)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Checkpoint temp files (.<name>.pt.<random>.tmp) that a killed process left in `folder`."""
    return files.remove_stale_temps(folder, ("*.pt",))


def load_checkpoint(path: str | Path, train_state: bool = True) -> dict[str, Any]:
    """Load one of our checkpoints safely (weights_only), with one clear error for anything else: a file
    that is not ours, or one whose contents do not follow the schema (check_checkpoint). With
    train_state=False the 'train' part is left unchecked (strip_checkpoint drops it anyway)."""
    path = Path(path)
    if not path.is_file():
        kind = files.special_file_kind(path) or ("a folder" if path.is_dir() else None)
        raise UserError(f"checkpoint {path} " + (f"is {kind}, not a file" if kind else "not found") +
                        "; pass a .pt written by train.py")
    not_torch = not_a_torch_file(path)
    if not_torch:
        raise UserError(f"checkpoint {path} is not a PyTorch file ({not_torch}); pass a .pt written by train.py")
    refuse_if_torchscript(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # weights_only refuses any pickle that would build arbitrary objects (and so could run code). YOLOv5's
        # pickled models are read again with stand-ins and converted; anything else is refused by name.
        refuse_if_marked_ours(path)
        from utils.interop.yolov5_compat import load_yolov5  # deferred: only YOLOv5 files need it
        ckpt = {"format": FORMAT, "version": VERSION, **load_yolov5(path)}
    except Exception as e:  # a damaged file can fail anywhere inside the unpickler (KeyError, EOFError, ...)
        msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read checkpoint {path} (truncated or corrupt: {msg}); "
                        f"use another checkpoint, e.g. best.pt of the same run") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UserError(f"{path} is not a checkpoint of this project (no '{FORMAT}' format marker); "
                        f"train one with train.py, or convert it first")
    try:
        check_checkpoint(ckpt if train_state else {k: v for k, v in ckpt.items() if k != "train"})
    except (SchemaError, TooLarge) as e:
        raise UserError(f"{path} is a damaged or edited checkpoint ({e}); use another checkpoint, "
                        f"e.g. best.pt of the same run") from None
    bad = [k for k, v in ckpt["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:  # it would run and find nothing, without a word
        raise UserError(f"{path} holds weights that are not finite (NaN or inf, in {len(bad)} tensors such as {bad[0]}): "
                        f"the training that wrote it diverged; use another checkpoint, e.g. an earlier epoch's")
    return ckpt


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive (and TorchScript's)
PICKLE_PROTO = 0x80  # the first byte of torch.save's older format, a bare pickle (protocol 2 and later)
MAX_PICKLE_BYTES = 64 << 20  # the pickle inside an archive, read as opcodes for its format marker; ours: ~100 kB


def not_a_torch_file(path: Path) -> str:
    """'' for a file that starts like something torch.save writes; else what it is instead, in a few words."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        return "it is empty"
    if head.startswith(ZIP_MAGIC) or head[0] == PICKLE_PROTO:
        return ""
    return f"it begins {head!r}, where torch.save writes a zip archive"


def refuse_if_torchscript(path: Path) -> None:
    """One UserError line for a TorchScript archive (what torch.jit.save, and so export.py, writes: the pickle with
    constants.pkl and the model's code/ beside it) where a checkpoint is expected; torch.load's own refusal is a
    paragraph that the 'truncated or corrupt' line cut mid-word. Only the archive's table of contents is read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            entries = {n.split("/", 1)[-1] for n in z.namelist()}
    except (zipfile.BadZipFile, OSError, ValueError):  # not an archive: torch.load says what it is
        return
    if "constants.pkl" not in entries and not any(n.startswith("code/") for n in entries):
        return
    ours = f"extra/{FORMAT}.json" in entries  # export.py's metadata (utils/interop/backends.META_KEY)
    if not ours:
        run_it = ""
    elif path.suffix.lower() == ".torchscript":
        run_it = "; test.py and detect.py run it as it is"
    else:
        run_it = f"; test.py and detect.py run it named {path.with_suffix('.torchscript')}"
    raise UserError(f"{path} is a TorchScript model{' exported by export.py' if ours else ''}, not a checkpoint; "
                    f"pass the .pt it was exported from (e.g. the run's weights/best.pt){run_it}")


def refuse_if_marked_ours(path: Path) -> None:
    """One UserError line for a file that carries this project's format marker ('format': 'ampyolo') but whose
    pickle names Python objects, which train.py never writes: a tampered file, not a YOLOv5 checkpoint. The pickle
    is read as opcodes (pickletools), never run."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"), None)
            if name is None or z.getinfo(name).file_size > MAX_PICKLE_BYTES:
                return
            strings = [arg for _, arg, _ in pickletools.genops(z.read(name)) if isinstance(arg, str)]
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not an archive we can read: the YOLOv5 reader says what it is
        return
    if ("format", FORMAT) in zip(strings, strings[1:]):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise UserError(f"refused to load {path}: it is marked as a checkpoint of this project, which holds only "
                        f"tensors and plain values, yet it names {shown or 'Python objects'}, which could run code if "
                        f"unpickled (nothing was run): a tampered file; use a checkpoint written by train.py")


MAX_CHECKPOINT_VALUES = 2_000_000  # values in the dict with shared objects counted each time; yolov5x's last.pt: ~10k


def check_checkpoint(ckpt: dict[str, Any]) -> None:
    """The schema of our checkpoints with the type of every field the code reads (SchemaError naming the
    first that is wrong). The model YAML itself is checked when the model is built (models/yolo.py)."""
    check_expanded(ckpt, MAX_CHECKPOINT_VALUES, "values")
    v = field_of(ckpt, "version")
    require(is_int(v), "version", "a whole number", v)
    if v > VERSION:
        raise SchemaError(f"format version {v} is newer than this code reads ({VERSION}); update the code")
    for key, ok, expected in (("yaml", lambda x: isinstance(x, dict), "a model config mapping"),
                              ("nc", lambda x: is_int(x) and 1 <= x <= MAX_CLASSES, f"a class count 1..{MAX_CLASSES}"),
                              ("names", lambda x: isinstance(x, list) and all(isinstance(n, str) for n in x),
                               "a list of class names"),
                              ("epoch", is_int, "a whole number"),
                              ("metrics", lambda x: isinstance(x, dict) and all(isinstance(k, str) and is_number(m)
                                                                                 for k, m in x.items()),
                               "a mapping of metric names to numbers"),
                              ("date", lambda x: isinstance(x, str), "text")):
        value = field_of(ckpt, key)
        require(ok(value) if value is not MISSING else False, key, expected, value)
    plain(ckpt["yaml"], "yaml")
    if len(ckpt["names"]) != ckpt["nc"]:
        raise SchemaError(f"'names' has {len(ckpt['names'])} entries but 'nc' is {ckpt['nc']}")
    if "imgsz" in ckpt:  # optional: files from before it, and converted YOLOv5 ones, have none
        require(is_int(ckpt["imgsz"]) and 1 <= ckpt["imgsz"] <= MAX_IMGSZ, "imgsz", f"a size 1..{MAX_IMGSZ}",
                 ckpt["imgsz"])
    if "data" in ckpt:  # optional, as imgsz
        require(isinstance(ckpt["data"], str), "data", "the path of a dataset YAML", ckpt["data"])
    state_dict_of(field_of(ckpt, "model"), "model")
    if "train" in ckpt:
        check_train_state(ckpt["train"], ckpt["model"])


def strip_checkpoint(path: str | Path) -> None:
    """Rewrite a training last.pt in best.pt's form: FP16 EMA and metadata only."""
    ckpt = load_checkpoint(path, train_state=False)
    if ckpt.pop("train", None) is not None:
        atomic_save(ckpt, path)
