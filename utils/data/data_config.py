"""Dataset and hyperparameter configuration: the data YAML (splits, names, defaults, COCO annotations),
the hyperparameter YAML and its bounds, and the COCO class tables.

Every path here is checked when the file is read, so a mistake is one line naming the file and the fix.
"""
from __future__ import annotations

import logging
from pathlib import Path

from utils.errors import UserError
from utils.files import REPO_ROOT, load_yaml
from utils.limits import MAX_CLASSES

LOGGER = logging.getLogger(__name__)

DATA_DIR = REPO_ROOT / "data"
DEFAULT_DATA_FILE = DATA_DIR / "shapes.yaml"  # the built-in dataset, generated on first use
# A copy of COCO128 beside the checkout (../shared/datasets/coco128): the tests and benchmarks that need real
# photos look for it here and skip or say so when it is absent; nothing downloads it.
SHARED_COCO128 = REPO_ROOT.parent / "shared" / "datasets" / "coco128"

# The 80 COCO detection classes in the usual YOLO order.
COCO_NAMES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)

# COCO category ids (1..90, with gaps for the 11 categories never annotated) of the 80 classes above.
COCO80_TO_91 = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32,
    33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
    60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
)


def load_data_config(path: str | Path) -> dict:
    """Read and check a dataset YAML (a path, or a bare name found in data/). Returns a dict: 'path' (dataset
    root), 'train'/'val'/'test' (lists of absolute folders or .txt lists; 'test' may be None), 'names', 'nc',
    'yaml_file', 'annotations' (COCO JSON or None), 'coco91' (COCO's category ids apply), 'defaults'."""
    yaml_file = _find_yaml(path)
    raw = load_yaml(yaml_file, "data file")
    names = _parse_names(raw, yaml_file)
    defaults = _parse_defaults(raw, yaml_file)
    try:
        root = _dataset_root(raw, yaml_file)
        info = raw.get("download_info")
        splits = {k: _resolve_split(raw, k, root, yaml_file, info) for k in ("train", "val", "test")}
        annotations = _annotations_file(raw, root, yaml_file)
    except (OSError, ValueError) as e:  # a path with a NUL byte, one too long for the file system, ...
        raise UserError(f"{yaml_file}: a path in it cannot be used ({' '.join(str(e).split())[:160]}); "
                        f"fix 'path', 'train', 'val', 'test' or 'annotations'") from None
    return {
        "path": root, **splits, "names": names, "nc": len(names), "yaml_file": yaml_file,
        "annotations": annotations,
        "coco91": tuple(names) == COCO_NAMES or raw.get("coco91") is True,
        "defaults": defaults,
    }


DEFAULT_LIMITS = {"epochs": 1_000_000, "imgsz": 16_384}  # suggestions a data YAML may make, and their bounds


def _parse_defaults(raw: dict, yaml_file: Path) -> dict:
    """The optional `defaults: {imgsz: 640, epochs: 100}`: positive integers where given."""
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"{yaml_file}: 'defaults' must be a mapping like {{imgsz: 640, epochs: 100}}")
    for key, limit in DEFAULT_LIMITS.items():
        v = defaults.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit):
            raise UserError(f"{yaml_file}: defaults.{key} must be a whole number from 1 to {limit}, got {v!r}")
    return dict(defaults)


def _find_yaml(path: str | Path) -> Path:
    """The YAML as given, or a bare name (`coco128`, `coco128.yaml`) looked up in data/."""
    p = Path(path)
    if p.is_file():
        return p.resolve()
    if len(p.parts) == 1:
        for cand in (DATA_DIR / p, DATA_DIR / f"{p}.yaml"):
            if cand.is_file():
                return cand
    if p.is_dir():
        inside = sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml"))
        raise UserError(f"--data {path} is a folder, not a dataset YAML; pass the YAML that describes it"
                        + (f", e.g. {inside[0]}" if inside else " (see data/coco128.yaml: path, train, val, names)"))
    known = ", ".join(sorted(f.name for f in DATA_DIR.glob("*.yaml")))
    raise UserError(f"data file {path} not found; pass the path of a dataset YAML or one of: {known}")


def _parse_names(raw: dict, yaml_file: Path) -> list[str]:
    """`names` as a list or {index: name}; `nc`, when given, must agree."""
    names = raw.get("names")
    if isinstance(names, dict):
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in names):
            raise UserError(f"{yaml_file}: 'names' keys must be the class indices 0, 1, 2, ... "
                            f"(got {next(k for k in names if not isinstance(k, int) or isinstance(k, bool))!r})")
        keys = sorted(names)
        if keys != list(range(len(keys))):
            raise UserError(f"{yaml_file}: 'names' keys must be 0..{len(keys) - 1} without gaps, got {keys[:10]}")
        names = [names[k] for k in keys]
    if not isinstance(names, list) or not names:
        raise UserError(f"{yaml_file}: missing 'names'; add the class names, e.g. names: ['cat', 'dog']")
    if len(names) > MAX_CLASSES:
        raise UserError(f"{yaml_file}: 'names' has {len(names)} classes; at most {MAX_CLASSES} are supported")
    odd = next((n for n in names if isinstance(n, (list, dict, set, tuple)) or n is None), False)
    if odd is not False:
        raise UserError(f"{yaml_file}: every class name must be plain text, got {str(odd)[:60]!r}; "
                        f"e.g. names: ['cat', 'dog']")
    nc = raw.get("nc")
    if nc is not None and nc != len(names):
        raise UserError(f"{yaml_file}: nc is {nc} but 'names' has {len(names)} entries; make them agree "
                        f"(or drop nc, it is derived from names)")
    return [str(n) for n in names]


def _dataset_root(raw: dict, yaml_file: Path) -> Path:
    """Absolute dataset folder: the generated one, or `path` relative to the YAML's folder."""
    gen = raw.get("generate")
    if gen is not None:
        if gen != "shapes":
            raise UserError(f"{yaml_file}: unknown generator {gen!r}; the only built-in one is 'shapes'")
        from utils.data.synthetic import ensure_shapes_dataset  # lazy: only the built-in dataset needs it

        return ensure_shapes_dataset()
    root = Path(str(raw.get("path") or "."))
    return root if root.is_absolute() else (yaml_file.parent / root).resolve()


def _resolve_split(raw: dict, key: str, root: Path, yaml_file: Path, info: str | None) -> list[Path] | None:
    """train/val/test: a folder, a .txt list or a list of those, relative entries against root."""
    entry = raw.get(key)
    if entry in (None, "", []):
        if key == "test":
            return None
        raise UserError(f"{yaml_file}: missing '{key}'; add e.g. {key}: images/{key} (relative to 'path')")
    entries = entry if isinstance(entry, list) else [entry]
    out = []
    for e in entries:
        p = Path(str(e))
        p = p if p.is_absolute() else root / p
        if not p.exists():
            if key == "test":  # optional split (COCO test-dev has no public labels): usable without it
                LOGGER.warning(f"warning: {yaml_file}: test images not found at {p}; 'test' split unavailable")
                return None
            fix = " ".join(str(info).replace("<path>", str(root)).split()) if info else \
                f"put the images there or fix 'path'/'{key}' in the YAML"
            raise UserError(f"{yaml_file}: {key} images not found at {p}; {fix}")
        out.append(p)
    return out


def _annotations_file(raw: dict, root: Path, yaml_file: Path) -> Path | None:
    """COCO-format ground truth: the `annotations` key, or <path>/annotations.json when present."""
    ann = raw.get("annotations")
    if ann:
        p = Path(str(ann))
        p = p if p.is_absolute() else root / p
        if p.is_file():
            return p
        # only COCO-style (--save-json) evaluation needs it, so training goes on without it
        LOGGER.warning(f"warning: {yaml_file}: annotations file {p} not found; COCO-json evaluation unavailable")
        return None
    default = root / "annotations.json"
    return default if default.is_file() else None
