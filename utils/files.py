"""Where things live on disk: run folders, weights lookup, the cache folder."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from utils.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
WEIGHTS_DIR = REPO_ROOT / "weights"


def cache_dir() -> Path:
    """Folder for generated data (the built-in dataset); $AMPYOLO_HOME overrides it."""
    return Path(os.environ.get("AMPYOLO_HOME", Path.home() / ".cache" / "ampyolo"))


def increment_path(project: str | Path, name: str = "exp", exist_ok: bool = False, mkdir: bool = True) -> Path:
    """Return project/name, or project/name2, name3, ... if it exists (unless exist_ok).

    The name must stay inside the project folder: `..` and absolute names are refused, so a run
    can never write outside the folder the user chose.
    """
    name = str(name)
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or len(parts) != 1:
        raise UserError(f"--name {name!r} must be a plain folder name (no '/', '..' or absolute path)")
    project = Path(project)
    path = project / name
    if path.exists() and not exist_ok:
        n = 2
        while (project / f"{name}{n}").exists():
            n += 1
        path = project / f"{name}{n}"
    if mkdir:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create output folder {path}: {e.strerror}; choose another --project") from None
    return path


def resolve_weights(path: str | Path) -> Path:
    """A checkpoint path as given, or a bare name found in weights/."""
    p = Path(path)
    if p.is_file():
        return p
    if len(p.parts) == 1 and (WEIGHTS_DIR / p).is_file():
        return WEIGHTS_DIR / p
    raise UserError(
        f"weights file {path} not found; pass the path of a checkpoint written by train.py "
        f"(runs/train/exp*/weights/best.pt) or place it in {WEIGHTS_DIR}/"
    )


def load_yaml(path: str | Path, what: str = "YAML file") -> dict:
    """yaml.safe_load a mapping; a missing, unreadable, malformed or unsafe file is one UserError line.

    safe_load refuses `!!python/...` tags, so no configuration file can run code.
    """
    import yaml  # local: only the CLIs need it

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} not found; check the path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())[:200]
        raise UserError(f"{what} {path} is not valid plain YAML ({detail}); fix the syntax "
                        f"(python tags such as !!python/object are not allowed)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path} cannot be read ({e}); check the path and permissions") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must be a YAML mapping (key: value lines), not {type(data).__name__}")
    return data


def save_yaml(data: dict, path: str | Path) -> None:
    """Write atomically (temp file, then rename): a kill mid-write leaves the previous file whole."""
    import yaml

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UserError(f"could not write {path}: {e.strerror or e}; free disk space or choose another --project") from None
