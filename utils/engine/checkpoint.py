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
from utils.errors import UserError, stop_on_signals
from utils.files import atomic_write
from utils.limits import MAX_CLASSES, MAX_IMGSZ, TooLarge, check_expanded

FORMAT = "ampyolo"
VERSION = 1


def fp16_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights in FP16 on the CPU (integer buffers such as BN's counters keep their dtype)."""
    return {k: (v.detach().half() if v.is_floating_point() else v.detach()).cpu().clone() for k, v in model.state_dict().items()}


def fp32_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


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
    with stop_on_signals.deferred():  # a stop waits for the write: torch.save cut inside its writer can abort
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


class SchemaError(ValueError):
    """A checkpoint field missing or of the wrong type; the message names the field."""


MAX_CHECKPOINT_VALUES = 2_000_000  # values in the dict with shared objects counted each time; yolov5x's last.pt: ~10k


def _require(ok: bool, field: str, expected: str, value: Any = None) -> None:
    if not ok:
        got = "missing" if value is _MISSING else f"got {type(value).__name__}"
        raise SchemaError(f"'{field}' must be {expected}, {got}")


_MISSING = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _field(d: dict, key: str) -> Any:
    return d.get(key, _MISSING)


def _state_dict(v: Any, field: str, like: dict[str, torch.Tensor] | None = None) -> None:
    """A dict of named tensors; with `like`, the same names and shapes (model, EMA and FP16 copy agree)."""
    _require(isinstance(v, dict) and len(v) > 0, field, "a non-empty dict of tensors", v)
    bad = next((k for k, t in v.items() if not isinstance(k, str) or not isinstance(t, torch.Tensor)), None)
    if bad is not None:
        raise SchemaError(f"'{field}' must map names to tensors, entry {str(bad)[:40]!r} does not")
    if like is not None and (v.keys() != like.keys() or any(v[k].shape != like[k].shape for k in v)):
        raise SchemaError(f"'{field}' does not hold the same tensors as 'model'")


def _plain(v: Any, field: str) -> None:
    """Only what a YAML file can hold (mappings, lists, text, numbers, booleans, None): a config read
    from a checkpoint is then handled exactly like one read from a file."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(k for k in x)
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif x is not None and not isinstance(x, (str, int, float, bool)):
            raise SchemaError(f"'{field}' must hold only plain values (text, numbers, lists, mappings), "
                              f"found {type(x).__name__}")


def check_checkpoint(ckpt: dict[str, Any]) -> None:
    """The schema of our checkpoints with the type of every field the code reads (SchemaError naming the
    first that is wrong). The model YAML itself is checked when the model is built (models/yolo.py)."""
    check_expanded(ckpt, MAX_CHECKPOINT_VALUES, "values")
    v = _field(ckpt, "version")
    _require(_is_int(v), "version", "a whole number", v)
    if v > VERSION:
        raise SchemaError(f"format version {v} is newer than this code reads ({VERSION}); update the code")
    for key, ok, expected in (("yaml", lambda x: isinstance(x, dict), "a model config mapping"),
                              ("nc", lambda x: _is_int(x) and 1 <= x <= MAX_CLASSES, f"a class count 1..{MAX_CLASSES}"),
                              ("names", lambda x: isinstance(x, list) and all(isinstance(n, str) for n in x),
                               "a list of class names"),
                              ("epoch", _is_int, "a whole number"),
                              ("metrics", lambda x: isinstance(x, dict) and all(isinstance(k, str) and _is_number(m)
                                                                                 for k, m in x.items()),
                               "a mapping of metric names to numbers"),
                              ("date", lambda x: isinstance(x, str), "text")):
        value = _field(ckpt, key)
        _require(ok(value) if value is not _MISSING else False, key, expected, value)
    _plain(ckpt["yaml"], "yaml")
    if len(ckpt["names"]) != ckpt["nc"]:
        raise SchemaError(f"'names' has {len(ckpt['names'])} entries but 'nc' is {ckpt['nc']}")
    if "imgsz" in ckpt:  # optional: files from before it, and converted YOLOv5 ones, have none
        _require(_is_int(ckpt["imgsz"]) and 1 <= ckpt["imgsz"] <= MAX_IMGSZ, "imgsz", f"a size 1..{MAX_IMGSZ}",
                 ckpt["imgsz"])
    if "data" in ckpt:  # optional, as imgsz
        _require(isinstance(ckpt["data"], str), "data", "the path of a dataset YAML", ckpt["data"])
    _state_dict(_field(ckpt, "model"), "model")
    if "train" in ckpt:
        check_train_state(ckpt["train"], ckpt["model"])


def check_train_state(t: Any, model: dict[str, torch.Tensor]) -> None:
    """The 'train' part of a last.pt written during training: what an exact resume loads."""
    _require(isinstance(t, dict), "train", "a mapping", t)
    _state_dict(_field(t, "model"), "train.model", model)
    ema = _field(t, "ema")
    _require(isinstance(ema, dict), "train.ema", "a mapping", ema)
    _state_dict(_field(ema, "ema"), "train.ema.ema", model)
    _require(_is_int(_field(ema, "updates")) and ema["updates"] >= 0, "train.ema.updates", "a count",
             _field(ema, "updates"))
    opt = _field(t, "optimizer")
    _require(isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)
             and len(opt["param_groups"]) > 0 and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                                      and all(_is_int(i) for i in g["params"])
                                                      for g in opt["param_groups"]),
             "train.optimizer", "an optimizer state (state, param_groups with params)", opt)
    for key in ("scheduler", "updater", "rng", "opt", "hyp"):
        _require(isinstance(_field(t, key), dict), f"train.{key}", "a mapping", _field(t, key))
    _plain(t["opt"], "train.opt")
    _plain(t["hyp"], "train.hyp")
    _require(isinstance(t["updater"].get("scaler", _MISSING), dict) and _is_int(t["updater"].get("skipped")),
             "train.updater", "{scaler: mapping, skipped: count}", t["updater"])
    rng = t["rng"]
    rng_ok = (isinstance(rng.get("torch"), torch.Tensor) and rng["torch"].dtype == torch.uint8
              and tuple(rng["torch"].shape) == tuple(torch.get_rng_state().shape)
              and isinstance(rng.get("numpy"), torch.Tensor) and tuple(rng["numpy"].shape) == (624,)
              and not rng["numpy"].is_floating_point()
              and isinstance(rng.get("numpy_pos"), list) and len(rng["numpy_pos"]) == 3
              and _is_int(rng["numpy_pos"][0]) and _is_int(rng["numpy_pos"][1]) and _is_number(rng["numpy_pos"][2])
              and 0 <= rng["numpy_pos"][0] <= 624
              and isinstance(rng.get("python"), list) and len(rng["python"]) == 625
              and all(_is_int(x) and 0 <= x < 2**32 for x in rng["python"]))
    _require(rng_ok, "train.rng", "the saved random-generator states (torch, numpy, numpy_pos, python)", rng)
    for key, ok, expected in (("best_fitness", _is_number, "a number"), ("best_epoch", _is_int, "a whole number"),
                              ("completed_epoch", lambda x: _is_int(x) and x >= -1, "an epoch number")):
        _require(ok(_field(t, key)), f"train.{key}", expected, _field(t, key))
    if "elapsed" in t:
        _require(_is_number(t["elapsed"]), "train.elapsed", "a number of seconds", t["elapsed"])
    for key in ("pictures", "batches_per_epoch"):  # optional: files from before them have none
        if key in t:
            _require(_is_int(t[key]) and t[key] >= 1, f"train.{key}", "a count of 1 or more", t[key])


def strip_checkpoint(path: str | Path) -> None:
    """Rewrite a training last.pt in best.pt's form: FP16 EMA and metadata only."""
    ckpt = load_checkpoint(path, train_state=False)
    if ckpt.pop("train", None) is not None:
        atomic_save(ckpt, path)
