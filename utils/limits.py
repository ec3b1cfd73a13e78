"""Bounds on what an untrusted input may expand to: YAML files, checkpoint contents, image sizes.

Each bound is far above any real use and far below what exhausts a machine; crossing it is one UserError
line that says which bound and how to change it where that makes sense.

- YAML (data, hyperparameter, model, opt.yaml): at most MAX_YAML_BYTES of text and MAX_YAML_NODES values
  once every alias is expanded. `safe_load` keeps aliases shared, but code that walks the result (a list
  of names turned into strings, a path list) expands them: nine-way aliases twelve levels deep are
  9**12 values. Self-referencing (recursive) aliases are refused too.
- Checkpoint contents: the same count over the unpickled dict (pickle's memo shares objects the way YAML
  aliases do), see `check_expanded`.
- Images: at most `max_image_pixels()` pixels, read from the file header before anything is decoded
  (utils/data/imageheader.py); AMPYOLO_MAX_PIXELS changes it.
- The input size (--imgsz): at most MAX_IMGSZ a side, and no more than the machine's memory can hold at the
  smallest model's need per pixel (`check_imgsz`), checked before anything is allocated.
"""
from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

from utils.errors import UserError

MAX_YAML_BYTES = 8 << 20  # the COCO data YAML is 2 KB, a 22k-class names list about 400 KB
MAX_YAML_NODES = 200_000  # values after alias expansion; ImageNet-21k's names are 22k
MAX_NESTING = 64  # no configuration of ours nests deeper than 4
MAX_CLASSES = 30_000  # LVIS has 1,203 classes, ImageNet-21k 21,841
DEFAULT_MAX_PIXELS = 100_000_000  # 100 megapixels: 300 MB decoded; an 8000x8000 photo (64 MP) passes
MAX_PIXELS_ENV = "AMPYOLO_MAX_PIXELS"


class TooLarge(ValueError):
    """A structure over one of the bounds above (the message says which)."""


def max_image_pixels() -> int:
    """Largest image (width x height) that is decoded: $AMPYOLO_MAX_PIXELS, else DEFAULT_MAX_PIXELS."""
    raw = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_PIXELS
    try:
        value = int(float(raw))
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{MAX_PIXELS_ENV}={raw!r} must be a positive number of pixels, e.g. 200000000")
    return value


class Duplicate(NamedTuple):
    """A mapping key written more than once: the key, the lines (1-based) of each time, the last value's text."""

    key: Any
    lines: tuple[int, ...]
    value: str


@functools.lru_cache(maxsize=1)
def _duplicate_key_loader() -> type:
    """yaml.SafeLoader that records, per mapping, the keys written more than once (in `duplicates`) and otherwise
    loads exactly as SafeLoader does: the last value wins. A merge key's (`<<`) entries overridden by the
    mapping's own are no duplicate. Built on first use: yaml is imported only where YAML is read."""
    import yaml

    class DuplicateKeyLoader(yaml.SafeLoader):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self.duplicates: list[Duplicate] = []
            self._scanned: set[int] = set()
            self._keep: list = []  # scanned nodes stay referenced, so that no id is reused

        def flatten_mapping(self, node: Any) -> None:
            # every mapping passes here before its merge keys are folded in (also one merged into another)
            if id(node) not in self._scanned:
                self._scanned.add(id(node))
                self._keep.append(node)
                self._record_duplicates(node)
            super().flatten_mapping(node)

        def _record_duplicates(self, node: Any) -> None:
            seen: dict[Any, list] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                try:
                    key = self.construct_object(key_node)
                    seen.setdefault(key, []).append((key_node.start_mark.line + 1, value_node))
                except (yaml.YAMLError, TypeError):  # an unusable key: SafeLoader's own error follows
                    continue
            for key, where in seen.items():
                if len(where) > 1:
                    value = where[-1][1]
                    text = value.value if isinstance(value, yaml.ScalarNode) else \
                        "a list" if isinstance(value, yaml.SequenceNode) else "a mapping"
                    self.duplicates.append(Duplicate(key, tuple(line for line, _ in where), text))

    return DuplicateKeyLoader


def load_bounded_yaml(text: str, duplicates: list[Duplicate] | None = None) -> Any:
    """Parse one YAML document with yaml.SafeLoader, refusing (TooLarge) a document whose values, with every
    alias expanded, number more than MAX_YAML_NODES, that nests deeper than MAX_NESTING or that refers to
    itself. The node graph is checked before any Python object is built (merge keys `<<` copy entries at
    construction, so a merge bomb is caught here too). yaml.YAMLError for malformed text. A key written twice
    in one mapping keeps its last value, as SafeLoader does; each such key is appended to `duplicates`."""
    if len(text) > MAX_YAML_BYTES:
        raise TooLarge(f"it is {len(text) / 2**20:.1f} MB; configuration files are far smaller "
                       f"(limit {MAX_YAML_BYTES >> 20} MB)")
    loader = _duplicate_key_loader()(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise TooLarge(f"it nests deeper than {MAX_NESTING} levels") from None
        if node is None:
            return None
        _check_nodes(node)
        data = loader.construct_document(node)
        if duplicates is not None:
            duplicates.extend(loader.duplicates)
        return data
    finally:
        loader.dispose()


def _node_children(node: Any) -> list:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_nodes(root: Any) -> None:
    _expanded(root, _node_children, "YAML values")


def check_expanded(obj: Any, limit: int, what: str) -> int:
    """Number of values in `obj` (dicts, lists, tuples, scalars) with shared objects counted each time they
    appear; TooLarge over `limit`, deeper than MAX_NESTING, or for an object that contains itself."""
    def children(o: Any) -> list:
        if isinstance(o, dict):
            return [v for kv in o.items() for v in kv]
        if isinstance(o, (list, tuple)):
            return list(o)
        return []

    return _expanded(obj, children, what, limit)


def _expanded(root: Any, children, what: str, limit: int = MAX_YAML_NODES) -> int:
    """Size of the tree `root` unfolds to, by an iterative depth-first walk that sizes each shared object
    once (memo by identity), so a 9**12 alias bomb costs a few hundred steps to measure."""
    sizes: dict[int, int] = {}
    path: set[int] = set()  # objects on the current branch: meeting one again is a cycle
    keep = []  # the walked objects stay referenced, so no id is reused while the walk runs
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            path.discard(key)
            total = 1 + sum(sizes[id(c)] for c in children(node))
            if total > limit:
                raise TooLarge(f"it expands to more than {limit:,} {what} (nested aliases or shared lists?)")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in path:
            raise TooLarge(f"it contains itself (a recursive alias or reference); {what} must form a tree")
        if len(path) >= MAX_NESTING:
            raise TooLarge(f"it nests deeper than {MAX_NESTING} levels")
        path.add(key)
        keep.append(node)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]


# ----------------------------------------------------------------------------------------- the input size
MAX_IMGSZ = 32_768  # px a side; YOLOv5's largest models train at 1280, aerial tiles are cut to a few thousand
# Memory a step needs at the least, per input pixel and image: yolov5n (the smallest model) in FP32 on a CPU
# measured 450-520 bytes for a training step (forward, loss, backward) and 120-145 for an inference forward, at
# 256-1024 px (peak resident size over the model's). Larger models need more; these are the floor.
TRAIN_BYTES_PER_PIXEL = 400
INFER_BYTES_PER_PIXEL = 100


def available_memory(device: Any) -> int | None:
    """Bytes a step on `device` may use: the GPU's total memory, or on a CPU the memory the kernel reports as
    available plus free swap (Linux); None where it cannot be read."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) * 1024 for k, v in (ln.split(":", 1) for ln in f if ":" in ln)}
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError):
        return None


def check_imgsz(hw: tuple[int, int], batch: int, training: bool, device: Any, flag: str = "--imgsz",
                memory: int | None = -1) -> None:
    """Refuse, in one UserError line, an input size no machine can run (over MAX_IMGSZ) or one whose smallest
    possible need (TRAIN/INFER_BYTES_PER_PIXEL x pixels x batch) exceeds the memory there is: such a run would
    otherwise be killed by the kernel's out-of-memory killer minutes later, with no message. `memory` (bytes)
    overrides what available_memory reads."""
    h, w = hw
    if max(h, w) > MAX_IMGSZ:
        raise UserError(f"{flag} {max(h, w)} is over the largest input size, {MAX_IMGSZ} px; images are resized to it, "
                        f"so use the size the model is trained for (640 for YOLOv5's models)")
    avail = available_memory(device) if memory == -1 else memory
    need = (TRAIN_BYTES_PER_PIXEL if training else INFER_BYTES_PER_PIXEL) * h * w * max(batch, 1)
    if avail is not None and need > avail:
        what = "a training batch" if training else "a batch"
        raise UserError(f"{flag} {max(h, w)}: {what} of {max(batch, 1)} image(s) at {h}x{w} needs at least "
                        f"{need / 2**30:.1f} GiB and {getattr(device, 'type', 'cpu')} has {avail / 2**30:.1f} GiB; "
                        f"use a smaller {flag} or --batch-size")
