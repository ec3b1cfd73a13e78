"""What a detection call hands back: boxes per picture, in the views YOLOv5's `Detections` offers, and the ways
to show them (text, annotated pictures, crops, tables).

    results = detector(["a.jpg", frame])      # models/api.py
    results.xyxy[0]                           # (n, 6) tensor: x1, y1, x2, y2, confidence, class (original pixels)
    results.print(); results.save("runs/detect/exp"); results.pandas().xyxy[0]

Pictures are kept as the BGR uint8 arrays the detector saw (OpenCV's order), and drawn with the helpers detect.py
uses (utils/report/draw.py), so a saved picture looks the same from either. The text summary ('2 circles,
1 square') is detect.py's log line too.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from utils.boxes import xyxy2xywh
from utils.errors import UserError
from utils.files import increment_path
from utils.inference import LINE_WIDTH
from utils.report.draw import class_name, crop_box, draw_detections, save_crop, write_image

TABLE_COLUMNS = {"xyxy": ["xmin", "ymin", "xmax", "ymax"], "xywh": ["xcenter", "ycenter", "width", "height"]}


def plural(name: str, n: int) -> str:
    if n == 1:
        return name
    if name.endswith(("s", "x", "z", "ch", "sh")):
        return name + "es"
    if len(name) > 1 and name.endswith("y") and name[-2] not in "aeiou":
        return name[:-1] + "ies"
    return name + "s"


def describe(det: np.ndarray | torch.Tensor, names: Sequence[str]) -> str:
    """'2 circles, 1 square' (most frequent first), or '(no detections)', for rows (x1, y1, x2, y2, conf, cls)."""
    det = np.asarray(det.detach().cpu() if isinstance(det, torch.Tensor) else det).reshape(-1, 6)
    if len(det) == 0:
        return "(no detections)"
    classes, counts = np.unique(det[:, 5].astype(int), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return ", ".join(f"{counts[i]} {plural(class_name(names, classes[i]), counts[i])}" for i in order)


@dataclass(frozen=True)
class Tables:
    """`Detections.pandas()`: per picture a DataFrame in each view, columns as YOLOv5's (xmin ... class, name)."""

    xyxy: list
    xywh: list
    xyxyn: list
    xywhn: list


class Detections:
    """Detections on a list of pictures. Indexing, slicing and iteration give `Detections` of single pictures.

    Views, each a list with one (n, 6) FP32 CPU tensor per picture, rows sorted by confidence:
      xyxy   x1, y1, x2, y2, confidence, class       in original pixels
      xywh   x-centre, y-centre, width, height, ...  in original pixels
      xyxyn, xywhn                                   the same divided by the picture's width and height
    Per picture also: `boxes` (n, 4 xyxy), `confidences` (n,), `classes` (n, int64), `labels` (class names).
    `ims` are the original pictures (BGR uint8), `files` their names, `names` the model's class names,
    `speed` milliseconds per picture for pre-process, inference and NMS, `shape` the last network input shape.
    """

    def __init__(self, ims: list[np.ndarray], pred: list[torch.Tensor], files: list[str], names: Sequence[str],
                 speed: dict[str, float] | None = None, shape: tuple[int, ...] = ()) -> None:
        if not (len(ims) == len(pred) == len(files)):
            raise ValueError(f"{len(ims)} pictures, {len(pred)} predictions and {len(files)} names do not match")
        self.ims, self.files, self.names = list(ims), list(files), list(names)
        self.pred = [p.detach().float().cpu().reshape(-1, 6) for p in pred]
        self.speed, self.shape = dict(speed or {}), tuple(shape)
        self.n = len(self.ims)

    # ------------------------------------------------------------------------------------- views

    def _gain(self, i: int) -> torch.Tensor:
        h, w = self.ims[i].shape[:2]
        return torch.tensor([w, h, w, h, 1.0, 1.0])

    @property
    def xyxy(self) -> list[torch.Tensor]:
        return self.pred

    @property
    def xywh(self) -> list[torch.Tensor]:
        return [xyxy2xywh(p) for p in self.pred]  # columns past the box (confidence, class) are carried over

    @property
    def xyxyn(self) -> list[torch.Tensor]:
        return [p / self._gain(i) for i, p in enumerate(self.xyxy)]

    @property
    def xywhn(self) -> list[torch.Tensor]:
        return [p / self._gain(i) for i, p in enumerate(self.xywh)]

    @property
    def boxes(self) -> list[torch.Tensor]:
        return [p[:, :4] for p in self.pred]

    @property
    def confidences(self) -> list[torch.Tensor]:
        return [p[:, 4] for p in self.pred]

    @property
    def classes(self) -> list[torch.Tensor]:
        return [p[:, 5].long() for p in self.pred]

    @property
    def labels(self) -> list[list[str]]:
        """Per picture, the class name of each box."""
        return [[class_name(self.names, int(c)) for c in p[:, 5]] for p in self.pred]

    # ------------------------------------------------------------------------------------- per picture

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int | slice) -> Detections:
        keep = range(self.n)[i] if isinstance(i, slice) else [range(self.n)[i]]  # range: IndexError as a list's
        return Detections([self.ims[k] for k in keep], [self.pred[k] for k in keep], [self.files[k] for k in keep],
                          self.names, self.speed, self.shape)

    def __iter__(self) -> Iterator[Detections]:
        return (self[i] for i in range(self.n))

    def tolist(self) -> list[Detections]:
        """One Detections per picture (as YOLOv5's)."""
        return list(self)

    # ------------------------------------------------------------------------------------- showing

    def __str__(self) -> str:
        lines = [f"image {i + 1}/{self.n} {f}: {im.shape[0]}x{im.shape[1]} {describe(p, self.names)}"
                 for i, (im, f, p) in enumerate(zip(self.ims, self.files, self.pred))]
        if self.speed:
            s = self.speed
            lines.append(f"Speed: {s['pre-process']:.1f}ms pre-process, {s['inference']:.1f}ms inference, "
                         f"{s['NMS']:.1f}ms NMS per image at shape {self.shape}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Detections: {self.n} picture(s), {sum(len(p) for p in self.pred)} box(es)>"

    def print(self) -> None:
        """Print one line per picture ('image 1/2 a.jpg: 480x640 2 circles, 1 square') and the speed."""
        print(str(self))

    def render(self, labels: bool = True, conf: bool = True, line_width: int = LINE_WIDTH,
               rgb: bool = False) -> list[np.ndarray]:
        """Annotated copies of the pictures (the originals are left as they are): BGR uint8 as OpenCV uses, or RGB
        (matplotlib, PIL) with rgb=True."""
        out = [draw_detections(im.copy(), p.numpy(), self.names, line_width, not labels, not conf)
               for im, p in zip(self.ims, self.pred)]
        return [np.ascontiguousarray(im[..., ::-1]) for im in out] if rgb else out

    def save(self, save_dir: str | Path = "runs/detect/exp", exist_ok: bool = False, labels: bool = True) -> Path:
        """Write the annotated pictures into `save_dir` (save_dir2, 3, ... when it exists, unless exist_ok), one file
        per picture under its name. Returns the folder."""
        folder = _folder(save_dir, exist_ok)
        for f, im in zip(self.files, self.render(labels)):
            write_image(im, folder / f)
        return folder

    def crop(self, save_dir: str | Path = "runs/detect/exp", save: bool = True, exist_ok: bool = False) -> list[dict]:
        """Each box's region of its picture (enlarged a little, as detect.py --save-crop). With save=True written to
        save_dir/crops/<class>/<picture>_<k>.jpg, detect.py's layout. Returns per box a dict: box (xyxy tensor),
        conf, cls, label ('name 0.87'), im (the BGR crop) and file (Path, or None when not saved)."""
        folder = _folder(save_dir, exist_ok) if save else None
        crops = []
        for im, f, p in zip(self.ims, self.files, self.pred):
            for k, (*xyxy, conf, c) in enumerate(p.tolist()):
                name = class_name(self.names, int(c))
                file = save_crop(im, xyxy, folder / "crops" / name / f"{Path(f).stem}_{k}.jpg") if folder else None
                crop = crop_box(im, xyxy)  # the region save_crop writes
                crops.append({"box": torch.tensor(xyxy), "conf": conf, "cls": int(c), "label": f"{name} {conf:.2f}",
                              "im": crop, "file": file})
        return crops

    def pandas(self) -> Tables:
        """The four views as pandas DataFrames (columns xmin, ymin, xmax, ymax or xcenter, ycenter, width, height,
        then confidence, class, name). Needs pandas, which this project does not require."""
        try:
            pd = importlib.import_module("pandas")
        except ImportError:
            raise UserError("Detections.pandas() needs pandas, which is not installed; run: pip install pandas "
                            "(or read .xyxy / .xywhn, which need nothing)") from None
        tables = {}
        for view in ("xyxy", "xywh", "xyxyn", "xywhn"):
            columns = [*TABLE_COLUMNS[view.rstrip("n")], "confidence", "class", "name"]
            tables[view] = [pd.DataFrame([[*r[:5], int(r[5]), class_name(self.names, int(r[5]))] for r in p.tolist()],
                                         columns=columns) for p in getattr(self, view)]
        return Tables(**tables)


def _folder(save_dir: str | Path, exist_ok: bool) -> Path:
    save_dir = Path(save_dir)
    return increment_path(save_dir.parent, save_dir.name, exist_ok=exist_ok)
