"""Where things live on disk and how they are written: run folders and their lock, weights lookup, the cache
folder, the one atomic writer, YAML and path-list reading."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from utils.errors import StopSignals, UserError

LOGGER = logging.getLogger(__name__)
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
            while True:
                try:
                    path.mkdir(parents=True, exist_ok=exist_ok)
                    break
                except FileExistsError:  # another process made it since the check above: take the next name
                    if path.is_file():
                        raise
                    n = 2 if path == project / name else int(path.name[len(name):]) + 1
                    path = project / f"{name}{n}"
        except OSError as e:
            raise UserError(f"cannot create output folder {path}: {e.strerror}; choose another --project") from None
    return path


LOCK_NAME = ".train.lock"


def _process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, Linux), '' where unknown: with the pid it names a
    process for good, so a lock of a dead process whose pid was reused is still seen as stale."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def lock_record(pid: int) -> str:
    """What a run folder's lock file holds for process `pid`: 'pid start'."""
    return f"{pid} {_process_start(pid)}".strip() + "\n"


def _lock_owner_alive(record: str) -> int | None:
    """The pid in a lock record if that very process still runs, else None (the lock is stale)."""
    parts = record.split()
    if not parts or not parts[0].isdigit():
        return None
    pid = int(parts[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # runs, under another user
        pass
    except (OSError, OverflowError):
        return None
    start = _process_start(pid)
    if len(parts) > 1 and start and start != parts[1]:
        return None  # the pid now belongs to another process
    return pid


@contextlib.contextmanager
def _folder_mutex(folder: Path):
    """Hold an exclusive flock on the folder itself while a lock is checked and written (POSIX; elsewhere
    the check and the write are simply not atomic against each other)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


class RunLock:
    """One train.py per run folder: a lock file (<folder>/.train.lock, 'pid start') made when the run starts
    and removed when it ends. A second run in the same folder (--exist-ok, or --resume of a run that still
    trains) stops with one line naming the process that holds it. A lock left by a process that no longer
    runs (killed) is taken over. The same process may take its own lock again (runs one after another in
    one Python session)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.held = False

    def acquire(self) -> RunLock:
        try:
            with _folder_mutex(self.folder):
                try:
                    record = self.path.read_text(encoding="utf-8", errors="replace")
                except FileNotFoundError:
                    record = ""
                owner = _lock_owner_alive(record)
                if owner is not None and owner != os.getpid():
                    raise UserError(f"run folder {self.folder} is in use by another train.py (pid {owner}); wait for "
                                    f"it to end or choose another --name (if no such run is going on, delete "
                                    f"{self.path})")
                if record and owner is None:
                    LOGGER.info(f"{self.path}: taking over the lock of process {record.split()[0]}, which no "
                                f"longer runs")
                atomic_write(self.path, lambda f: f.write(lock_record(os.getpid()).encode()))
        except OSError as e:
            raise UserError(f"cannot lock run folder {self.folder}: {e.strerror or e}; check the folder") from None
        self.held = True
        return self

    def release(self) -> None:
        """Remove the lock file if this process holds it (never another process's)."""
        if not self.held:
            return
        self.held = False
        with contextlib.suppress(OSError), _folder_mutex(self.folder):
            if _lock_owner_alive(self.path.read_text(encoding="utf-8", errors="replace")) == os.getpid():
                self.path.unlink()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


MAX_LIST_BYTES = 256 << 20  # a list of 5 million paths; anything larger is not a list we were meant to read


def read_path_list(txt: str | Path, what: str = "list") -> list[Path]:
    """The paths listed one per line in a text file (training's image lists and detect.py's --source .txt
    share this reader). Blank lines and '#' comments are skipped; a relative path is relative to the
    list's own folder. A file that is not UTF-8 text (binary, NUL bytes), cannot be read or is absurdly
    large is one UserError line."""
    txt = Path(txt)
    try:
        size = txt.stat().st_size
        if size > MAX_LIST_BYTES:
            raise UserError(f"{what} {txt} is {size / 2**20:.0f} MB; a list of paths is far smaller - is it the "
                            f"right file?")
        raw = txt.read_bytes()
    except OSError as e:
        raise UserError(f"{what} {txt} cannot be read ({e.strerror or e}); check the path and permissions") from None
    nul = raw.find(b"\x00")
    try:
        if nul >= 0:
            raise ValueError(f"a NUL byte at byte {nul}")
        text = raw.decode("utf-8-sig")
    except ValueError as e:  # UnicodeDecodeError is a ValueError
        reason = f"invalid UTF-8 at byte {e.start}" if isinstance(e, UnicodeDecodeError) else str(e)
        raise UserError(f"{what} {txt} is not a text list of paths ({reason}); pass a .txt file with one "
                        f"path per line") from None
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line).expanduser()
        out.append(Path(os.path.normpath(p if p.is_absolute() else txt.parent / p)))
    return out


def special_file_kind(path: str | Path) -> str | None:
    """'a FIFO', 'a character device' ... for a path that exists but is no regular file or folder, else None.
    Only stat()s the path: opening a FIFO or /dev/zero could block or never end."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def remove_empty_tree(folder: str | Path) -> None:
    """Remove `folder` if it holds nothing but empty folders (an output folder nothing was written to)."""
    folder = Path(folder)
    if not folder.is_dir() or any(p.is_file() or p.is_symlink() for p in folder.rglob("*")):
        return
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        d.rmdir()
    folder.rmdir()


def resolve_weights(path: str | Path) -> Path:
    """A checkpoint path as given, or a bare name found in weights/; a folder only where it can be an OpenVINO model
    (export.py's <stem>_openvino_model/, or any folder with an .xml file: the backend then says what is wrong)."""
    p = Path(path)
    if p.is_file():
        return p
    if len(p.parts) == 1 and (WEIGHTS_DIR / p).is_file():
        return WEIGHTS_DIR / p
    if p.is_dir() and (p.name.endswith("_openvino_model") or any(p.glob("*.xml"))):
        return p
    if p.is_dir():
        inside = sorted(p.glob("*.pt")) or sorted(p.glob("weights/*.pt"))
        raise UserError(f"weights {path} is a folder, not a checkpoint file nor an OpenVINO model folder; pass a .pt "
                        "file" + (f", e.g. {inside[0]}" if inside else " written by train.py (runs/train/exp*/weights/"
                                                                      "best.pt)"))
    raise UserError(
        f"weights file {path} not found; pass the path of a checkpoint written by train.py "
        f"(runs/train/exp*/weights/best.pt) or place it in {WEIGHTS_DIR}/"
    )


def load_yaml(path: str | Path, what: str = "YAML file") -> dict:
    """Load a YAML mapping with the safe loader, bounded (utils.limits.load_bounded_yaml): a missing,
    unreadable, malformed, unsafe or oversized file (an alias bomb) is one UserError line.

    The safe loader refuses `!!python/...` tags, so no configuration file can run code. Every YAML the
    project reads (data, hyperparameters, models, a run's opt.yaml) comes through here.

    A key written twice in one mapping (lr0 edited at the top and again appended at the bottom) keeps its last
    value, with one warning line per key naming the file, the key, its lines and the value used. Warned, not
    refused: YOLOv5 reads these files with yaml.safe_load, which keeps the last value silently, so a hyp or data
    file that trains there trains here with the same values; the warning says which one that is.
    """
    import yaml  # local: only the CLIs need it

    from utils.limits import TooLarge, load_bounded_yaml

    path = Path(path)
    if not path.is_file():
        kind = special_file_kind(path)
        raise UserError(f"{what} {path} " + (f"is {kind}, not a regular file" if kind else "not found") +
                        "; check the path")
    duplicates: list = []
    try:
        data = load_bounded_yaml(path.read_text(encoding="utf-8"), duplicates)
    except TooLarge as e:
        raise UserError(f"{what} {path} is refused: {e}; write the values out plainly") from None
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())[:200]
        raise UserError(f"{what} {path} is not valid plain YAML ({detail}); fix the syntax "
                        f"(python tags such as !!python/object are not allowed)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what} {path} cannot be read ({e}); check the path and permissions") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must be a YAML mapping (key: value lines), not {type(data).__name__}")
    for d in duplicates:
        lines = sorted(set(d.lines))
        at = f"line {lines[0]}" if len(lines) == 1 else f"lines {', '.join(map(str, lines[:-1]))} and {lines[-1]}"
        times = "twice" if len(d.lines) == 2 else f"{len(d.lines)} times"
        value = " ".join(str(d.value).split())[:80]
        LOGGER.warning(f"warning: {what} {path} sets {d.key} {times} ({at}); the last value is used, {d.key}: {value} "
                       f"(as YOLOv5 reads it); delete the line you do not mean")
    return data


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], fix: str = "free disk space or choose "
                 "another --project", before_replace: Callable[[], None] | None = None, durable: bool = True) -> None:
    """The one way this project replaces a file: `write` fills a uniquely named temp file beside `path`,
    which is fsynced and then renamed over `path`. durable=False skips the fsync, for the many small files of
    one run (detect.py's pictures and labels): each is still whole or absent after a kill, only a crash of the
    machine may lose the last few.

    A kill mid-write leaves the previous file whole; two processes writing into one folder never share a
    temp name. Any failure inside the write (a full disk turns up as OSError, or as torch's
    `RuntimeError: [enforce fail at inline_container.cc ...]` at close) removes the temp file, keeps the
    previous file and becomes one UserError line ending in `fix`. `before_replace` runs between the write
    and the rename (fault injection, utils/engine/faults.py).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.chmod(fd, 0o644)  # mkstemp makes 0600: an output should be as readable as any other file
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
        tmp = None
    except Exception as e:  # noqa: BLE001 - whatever broke the write, the user gets one line
        if isinstance(e, UserError):
            raise
        if getattr(StopSignals.active(), "requested", False):  # Ctrl-C inside torch.save reaches us as its writer's RuntimeError
            raise KeyboardInterrupt from None
        raise UserError(f"could not write {path}: {_reason(e)}; the previous file is kept. {fix}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def replace_folder(new: str | Path, path: str | Path, fix: str = "free disk space or choose another folder") -> None:
    """Put the finished folder `new` (made beside `path`, on the same file system) at `path`, replacing a folder of
    the same name. Renames only: rename(2) will not replace a non-empty folder, so the old one is first renamed
    aside and removed once the new one is in place. A failure keeps (or restores) the old folder: one UserError line
    ending in `fix`."""
    import shutil

    new, path = Path(new), Path(path)
    aside = path.with_name(f".{path.name}.{os.getpid()}.old") if path.exists() else None
    try:
        if aside is not None:
            os.replace(path, aside)
        os.replace(new, path)
    except OSError as e:
        if aside is not None and not path.exists():
            with contextlib.suppress(OSError):
                os.replace(aside, path)
        raise UserError(f"could not write {path}: {_reason(e)}; the previous folder is kept. {fix}") from None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _reason(e: Exception) -> str:
    """A write failure in a few words: the errno text, or the first line of any other error."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())
    if "enforce fail" in text or "unexpected pos" in text:  # torch's zip writer hides the ENOSPC behind this
        return f"the write was cut short, most likely the disk is full ({text[:100]})"
    return text[:160] or type(e).__name__


def remove_stale_temps(folder: str | Path, targets: tuple[str, ...] = ("*.pt",)) -> list[Path]:
    """Delete temp files that atomic_write left in `folder` when its process was killed mid-write.

    Only the temp names atomic_write makes for the given targets (.<target>.<random>.tmp) are touched, only
    in that one folder; the caller holds the run folder's lock (RunLock), so no live writer owns them.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for t in targets for p in folder.glob(f".{t}.*.tmp")
             if re.fullmatch(r"\.[^.].*\.[A-Za-z0-9_]+\.tmp", p.name) and p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def save_yaml(data: dict, path: str | Path, header: str = "") -> None:
    """Write atomically (utils.files.atomic_write): a kill mid-write leaves the previous file whole. `header`
    lines go first, as comments."""
    import yaml

    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(data, sort_keys=False)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
