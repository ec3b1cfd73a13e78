"""Evaluation of a detector on a dataset split: mAP@0.5, mAP@0.5:0.95, P, R, speed, plots, COCO JSON.

The library behind test.py's command line. `run(data, weights=...)` evaluates a checkpoint (a list of several:
an ensemble, their predictions joined before NMS as in YOLOv5);
train.py calls `run(data, model=ema, dataloader=...)` on the live model. Both take the same path after
set-up. Every setting is one field of `EvalOptions` (the command line is built from it). Metrics follow
COCO (utils/report/metrics.py) and agree with pycocotools, which also runs on the saved JSON when the dataset has
COCO-format ground truth.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from models.yolo import load_for_inference
from utils.boxes import non_max_suppression, scale_boxes, xywh2xyxy
from utils.data.data_config import COCO80_TO_91, DEFAULT_DATA_FILE, load_data_config
from utils.data.datasets import create_dataloader
from utils.device import select_device
from utils.engine.amp import inference_dtype, prepare_inference
from utils.engine.dist import de_parallel
from utils.errors import UserError
from utils.files import atomic_write, increment_path
from utils.inference import (CONF_THRES, IOU_THRES, InferenceOptions, Timer, check_rules, default_imgsz,
                             inference_rules, round_imgsz, write_yolo_labels)
from utils.interop.backends import fixed_imgsz
from utils.limits import check_imgsz
from utils.options import option
from utils.report.metrics import (CONF_GRID, RECALL_THRESHOLDS, APResult, ConfusionMatrix, ap_per_class, fitness,
                                  match_predictions)
from utils.report.previews import MAX_IMAGES, PreviewThread, plot_val_batch

LOGGER = logging.getLogger(__name__)

TASKS = ("val", "test", "speed")
SPEED_THRESHOLDS = (CONF_THRES, IOU_THRES)  # conf, IoU for --task speed: what deployment (detect.py) uses
PREVIEW_BATCHES = 3  # val_batch0..2_labels.jpg / _pred.jpg


@dataclass
class ValResult:
    """What one evaluation returns. Per-class arrays have nc entries; classes without labels in the
    split hold the overall mean (neutral for class weighting)."""

    mp: float = 0.0
    mr: float = 0.0
    map50: float = 0.0
    map: float = 0.0
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ap50: np.ndarray = field(default_factory=lambda: np.zeros(0))
    loss: torch.Tensor | None = None  # (3,) box, obj, cls mean per batch, when compute_loss was given
    speed: dict = field(default_factory=dict)  # ms per image: pre-process, inference, nms
    nt: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # labels per class
    coco: dict | None = None  # pycocotools' {'map', 'map50'} when it ran
    save_dir: Path | None = None

    @property
    def fitness(self) -> float:
        return fitness(self)


# ---------------------------------------------------------------------------------------------
# set-up: model, data, loader


def _load_data(data: str | Path | dict) -> dict:
    return data if isinstance(data, dict) else load_data_config(data)


def _prepare_model(weights: str | Path | list | None, model: nn.Module | None, device: str,
                   half: bool | None) -> tuple[nn.Module, torch.device, torch.dtype, list[str] | None]:
    """(model ready for inference, device, dtype, checkpoint class names or None).

    Live: the caller's model is never cast, moved or switched to eval in place (prepare_inference
    hands back a converted copy when anything would change). Standalone: the FP32 checkpoint model is
    fused and cast by the same precision rule.
    """
    if model is not None:
        p = next(model.parameters())
        dev = p.device
        dtype = inference_dtype(dev, half)
        return prepare_inference(model, dev, dtype, copy_model=True), dev, dtype, None
    if weights is None:
        raise UserError("test.run needs weights= (a checkpoint) or model= (a live model)")
    dev = select_device(device)
    backend = load_for_inference(weights, dev, half)  # .pt, .onnx, .torchscript or an ensemble (utils/interop/backends.py)
    return backend, dev, backend.dtype, backend.names or None


def _check_classes(model: nn.Module, data: dict, single_cls: bool, source: str) -> int:
    nc = 1 if single_cls else int(data["nc"])
    ncm = int(getattr(de_parallel(model), "nc", nc))
    if ncm != nc:
        raise UserError(f"{source} predicts {ncm} classes but {data.get('yaml_file', 'the data')} has {nc}"
                        f"{' (--single-cls)' if single_cls else ''}; evaluate it on the dataset it was trained for")
    return nc


def _split(data: dict, task: str) -> list[Path]:
    """The image sources the task evaluates (checked before any model is loaded)."""
    split = "test" if task == "test" else "val"
    if not data.get(split):
        raise UserError(f"{data.get('yaml_file', 'data')}: no '{split}' split; add {split}: <images> or use --task val")
    return data[split]


def _make_loader(data: dict, task: str, imgsz: int, batch_size: int, stride: int, single_cls: bool, workers: int,
                 rect_ok: bool = True):
    # speed: square batches like deployment; a static-shape export takes square batches only
    rect, pad = (False, 0.0) if task == "speed" or not rect_ok else (True, 0.5)
    loader, _ = create_dataloader(_split(data, task), imgsz, batch_size, stride, rect=rect, pad=pad, workers=workers,
                                  single_cls=single_cls, prefix=f"{task}: ", nc=None if single_cls else data["nc"])
    return loader


# ---------------------------------------------------------------------------------------------
# per-image bookkeeping


def _image_id(path: str | Path) -> int | str:
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


class _Accumulator:
    """Everything gathered over the batches: match statistics, confusion matrix, timings, outputs."""

    def __init__(self, nc: int, data: dict, save_dir: Path | None, opt: EvalOptions, device: torch.device) -> None:
        self.nc, self.opt, self.save_dir = nc, opt, save_dir
        self.stats: list[tuple[torch.Tensor, ...]] = []
        self.confusion = ConfusionMatrix(nc)
        self.images_per_class = np.zeros(nc, dtype=np.int64)
        self.seen, self.batches = 0, 0
        self.batch_shape: tuple[int, ...] = ()
        self.timers = [Timer(device) for _ in range(3)]  # pre-process, inference, NMS
        self.loss: torch.Tensor | None = None
        self.jdict: list[dict] = []
        self.image_ids: list[int | str] = []
        self.id_owner: dict[int | str, str] = {}  # image_id -> the picture it was given to
        self.cat_ids = COCO80_TO_91 if data.get("coco91") and opt.save_json else None

    def add_loss(self, items: torch.Tensor) -> None:
        items = items.detach().float().cpu()
        self.loss = items if self.loss is None else self.loss + items

    def add_batch(self, out: list[torch.Tensor], targets: torch.Tensor, paths: list[str], shapes: list,
                  hw: tuple[int, int]) -> None:
        """Map one batch's detections and labels back to original pixels and record them."""
        h, w = hw
        self.batches += 1
        for si, pred in enumerate(out):
            self.seen += 1
            if self.opt.task == "speed":
                continue
            labels = targets[targets[:, 0] == si, 1:]
            shape0, ratio_pad = (shapes[si][0], shapes[si][1]) if shapes[si] is not None else ((h, w), None)
            predn = pred.clone()
            predn[:, :4] = scale_boxes((h, w), pred[:, :4], shape0, ratio_pad)
            tbox = scale_boxes((h, w), xywh2xyxy(labels[:, 1:5] * labels.new_tensor([w, h, w, h])), shape0, ratio_pad)
            self.add_image(predn, torch.cat([labels[:, :1], tbox], 1))
            if self.opt.save_txt:
                self._save_txt(predn, shape0, paths[si])
            if self.opt.save_json:
                self._add_json(predn, paths[si])

    def add_image(self, predn: torch.Tensor, labelsn: torch.Tensor) -> None:
        """One image: detections (n, 6) and labels (m, 5) cls + xyxy, both in original pixels."""
        correct = match_predictions(predn, labelsn)
        self.stats.append((correct.cpu(), predn[:, 4].cpu(), predn[:, 5].cpu(), labelsn[:, 0].cpu()))
        self.confusion.process_batch(predn, labelsn)
        self.images_per_class[np.unique(labelsn[:, 0].long().cpu().numpy())] += 1

    def _save_txt(self, predn: torch.Tensor, shape0: tuple[int, int], path: str) -> None:
        """labels/<stem>.txt in YOLO format (utils.inference.write_yolo_labels, shared with detect.py)."""
        write_yolo_labels(self.save_dir / "labels" / f"{Path(path).stem}.txt", predn, shape0, self.opt.save_conf)

    def _add_json(self, predn: torch.Tensor, path: str) -> None:
        """COCO result entries: [x, y, w, h] in original pixels, category id per the dataset's scheme."""
        image_id = self._unique_id(path)
        self.image_ids.append(image_id)
        box = predn[:, :4].cpu().double()
        box[:, 2:] -= box[:, :2]
        for b, s, c in zip(box.tolist(), predn[:, 4].tolist(), predn[:, 5].long().tolist()):
            cat = self.cat_ids[c] if self.cat_ids is not None else c
            self.jdict.append({"image_id": image_id, "category_id": cat, "bbox": [round(x, 3) for x in b], "score": round(s, 5)})

    def _unique_id(self, path: str) -> int | str:
        """The picture's COCO image_id (its numeric stem, as COCO names them); where another picture already has
        it (0001.jpg and 1.jpg, or a.jpg in two folders) its path instead, said in one line: one id would merge the
        two pictures' predictions."""
        image_id = _image_id(path)
        first = self.id_owner.setdefault(image_id, path)
        if first != path:
            LOGGER.warning(f"warning: {path} and {first} both give image_id {image_id!r}; {path}'s predictions are "
                           f"saved under its path as image_id instead (rename one of them to keep numeric ids)")
            image_id = str(path)
            self.id_owner.setdefault(image_id, path)
        return image_id

    def metrics(self) -> tuple[APResult | None, np.ndarray]:
        """(AP result or None without statistics, labels per class)."""
        if not self.stats:
            return None, np.zeros(self.nc, dtype=np.int64)
        tp, conf, pcls, tcls = (torch.cat(x, 0).numpy() for x in zip(*self.stats))
        nt = np.bincount(tcls.astype(np.int64), minlength=self.nc)
        return ap_per_class(tp, conf, pcls, tcls), nt

    def speed(self) -> dict[str, float]:
        per = np.array([t.total for t in self.timers]) / max(self.seen, 1) * 1e3
        return {"pre": float(per[0]), "inference": float(per[1]), "nms": float(per[2])}


# ---------------------------------------------------------------------------------------------
# the evaluation


TASKS_HELP = "val or test split; speed: timing only"


@dataclass(frozen=True)
class EvalOptions(InferenceOptions):
    """Every setting of an evaluation: run()'s keywords, and the command line (built from these fields)."""

    data: str | Path | dict = option(str(DEFAULT_DATA_FILE), "dataset YAML (default: the built-in shapes dataset)")
    # a list of several checkpoints is one ensemble (YOLOv5's val.py); test.py --task speed times each in turn instead
    weights: str | Path | list | None = option(
        None, "checkpoint (train.py's or YOLOv5's) or .onnx / .torchscript file from export.py; several checkpoints are "
              "evaluated as one ensemble (with --task speed: timed one after another)", nargs="+", required=True)
    batch_size: int = option(32, "images per batch")
    imgsz: int | None = option(None, "inference size in pixels (default: the size the weights were trained at, else "
                                     "the dataset's suggested size, else 640)",
                               "--imgsz", "--img", "--img-size", type=int)
    conf_thres: float = option(0.001, "confidence threshold")
    iou_thres: float = option(0.6, "NMS IoU threshold")
    max_det: int = option(300, "maximum detections per image")
    task: str = option("val", TASKS_HELP, choices=TASKS)
    workers: int = option(8, "data loader worker processes (capped by CPUs)")
    project: str | Path = option("runs/test", "results go to project/name")
    single_cls: bool = option(False, "treat all classes as one")
    verbose: bool = option(False, "per-class table")
    save_json: bool = option(False, "save COCO-format predictions (and run pycocotools when the data has annotations)")
    plots: bool = option(True, "skip the plots", "--no-plots", action="store_false")
    save_dir: str | Path | None = option(None, cli=False)  # train.py's run folder: files go there

    def checked(self) -> EvalOptions:
        """Refused with one line before any work; --task speed fixes the deployment thresholds and writes nothing."""
        if self.task not in TASKS:
            raise UserError(f"--task {self.task!r} is not valid; use one of {', '.join(TASKS)}")
        opts = replace(self, conf_thres=SPEED_THRESHOLDS[0], iou_thres=SPEED_THRESHOLDS[1], save_txt=False,
                       save_json=False, plots=False) if self.task == "speed" else self
        check_rules([*inference_rules(opts.conf_thres, opts.iou_thres, opts.max_det, opts.batch_size),
                     (opts.imgsz is None or opts.imgsz >= 1, f"--imgsz {opts.imgsz} must be a positive number of pixels")])
        return opts


def _evaluate(model: nn.Module, loader, device: torch.device, dtype: torch.dtype, acc: _Accumulator,
              compute_loss: Callable | None, preview: Callable | None = None) -> None:
    """The batch loop: pre-process, forward, loss (optional), NMS, bookkeeping; each stage timed. `preview` gets
    the first PREVIEW_BATCHES batches (index, images, targets, detections, paths) after their NMS."""
    opt, timers = acc.opt, acc.timers
    for bi, (imgs, targets, paths, shapes) in enumerate(tqdm(loader, desc=f"{opt.task}", leave=False, unit="batch")):
        with timers[0]:
            imgs = imgs.to(device, non_blocking=True).to(dtype) / 255
            targets = targets.to(device)
        with timers[1]:
            pred, raw = model(imgs, augment=opt.augment)
        if compute_loss is not None and raw is not None:
            acc.add_loss(compute_loss([x.float() for x in raw], targets)[1])
        with timers[2]:
            # every class above the threshold counts during validation; speed runs measure deployment NMS
            out = non_max_suppression(pred, opt.conf_thres, opt.iou_thres, multi_label=opt.task != "speed",
                                      agnostic=opt.single_cls, max_det=opt.max_det)
        acc.batch_shape = tuple(imgs.shape)
        acc.add_batch(out, targets, list(paths), list(shapes), tuple(imgs.shape[2:]))
        if preview is not None and bi < PREVIEW_BATCHES:
            preview(bi, imgs, targets, out, list(paths))


def _batch_pictures(previews: PreviewThread | None, names: list[str], save_dir: Path | None) -> Callable | None:
    """_evaluate's `preview`: val_batch{k}_labels.jpg and _pred.jpg drawn on the PreviewThread (None: no pictures)."""
    if previews is None:
        return None

    def draw(bi: int, imgs: torch.Tensor, targets: torch.Tensor, out: list[torch.Tensor], paths: list[str]) -> None:
        n = MAX_IMAGES  # only what a picture shows is copied off the device
        previews.submit(plot_val_batch, imgs[:n], targets[targets[:, 0] < n], out[:n], names,
                        save_dir / f"val_batch{bi}_labels.jpg", save_dir / f"val_batch{bi}_pred.jpg", paths[:n])

    return draw


def _summarise(acc: _Accumulator) -> tuple[ValResult, APResult | None]:
    ap, nt = acc.metrics()
    res = ValResult(speed=acc.speed(), nt=nt, save_dir=acc.save_dir)
    if acc.loss is not None:
        res.loss = acc.loss / max(acc.batches, 1)
    if ap is None or not len(ap.classes):
        res.maps, res.ap50 = np.zeros(acc.nc), np.zeros(acc.nc)
        if acc.opt.task != "speed":
            LOGGER.warning(f"warning: no labels in the {acc.opt.task} split; mAP cannot be computed")
        return res, ap
    res.mp, res.mr, res.map50, res.map = ap.mp, ap.mr, ap.map50, ap.map
    res.maps, res.ap50 = np.full(acc.nc, ap.map), np.full(acc.nc, ap.map50)
    res.maps[ap.classes], res.ap50[ap.classes] = ap.ap.mean(1), ap.ap50
    return res, ap


def score_predictions(images: Sequence[tuple[torch.Tensor, torch.Tensor]], nc: int) -> APResult | None:
    """AP of ready-made (detections (n, 6), labels (m, 5) cls + xyxy) pairs, one per image in original pixels,
    through the evaluation's own accumulation (the pycocotools agreement test; `bench/speed.py metrics` times it)."""
    acc = _Accumulator(nc, {}, None, EvalOptions(), torch.device("cpu"))
    for predn, labelsn in images:
        acc.add_image(predn, labelsn)
    return acc.metrics()[0]


def _print_table(res: ValResult, ap: APResult | None, acc: _Accumulator, names: list[str]) -> None:
    head = f"{'Class':>22}{'Images':>11}{'Instances':>11}{'P':>11}{'R':>11}{'mAP50':>11}{'mAP50-95':>11}"
    row = "{:>22}{:>11d}{:>11d}{:>11.3g}{:>11.3g}{:>11.3g}{:>11.3g}"
    lines = [head, row.format("all", acc.seen, int(res.nt.sum()), res.mp, res.mr, res.map50, res.map)]
    if acc.opt.verbose and ap is not None:
        for i, c in enumerate(ap.classes):
            name = names[c] if c < len(names) else str(c)
            lines.append(row.format(name, int(acc.images_per_class[c]), int(ap.n_labels[i]), ap.p[i], ap.r[i],
                                    ap.ap50[i], ap.ap[i].mean()))
    LOGGER.info("\n".join(lines))


def _print_speed(speed: dict, shape: tuple) -> None:
    LOGGER.info(f"Speed: {speed['pre']:.1f} ms pre-process, {speed['inference']:.1f} ms inference, "
                f"{speed['nms']:.1f} ms NMS per image (last batch shape {shape})")


def _plot(save_dir: Path, acc: _Accumulator, ap: APResult | None, names: list[str]) -> None:
    """Confusion matrix, PR and P/R/F1-confidence curves, drawn by utils.report.plots when it provides them. A chart
    that fails is one warning line (plots.never_fatal), never the end of a validation: the results are computed."""
    try:
        from utils.report import plots
    except ImportError as e:
        LOGGER.info(f"plots skipped ({e})")
        return
    never_fatal = plots.never_fatal
    never_fatal(plots.plot_confusion_matrix, "confusion_matrix.png")(acc.confusion.matrix, names[: acc.nc], save_dir)
    if ap is None or not len(ap.classes):
        return
    cls_names = [names[c] if c < len(names) else str(c) for c in ap.classes]
    never_fatal(plots.plot_pr_curve, "PR_curve.png")(RECALL_THRESHOLDS, ap.pr_curve, ap.ap, save_dir, cls_names)
    for curve, label in ((ap.f1_curve, "F1"), (ap.p_curve, "Precision"), (ap.r_curve, "Recall")):
        never_fatal(plots.plot_mc_curve, f"{label}_curve.png")(CONF_GRID, curve, save_dir, cls_names, ylabel=label)


def coco_evaluate(anno_json: Path, pred_json: Path, image_ids: Sequence[int | str]) -> dict | None:
    """pycocotools COCOeval (bbox) of saved predictions on the evaluated images; logs its table.

    Returns {'map': AP@0.5:0.95, 'map50': AP@0.5, 'stats': all 12 numbers}, or None (with a warning)
    when it cannot run: pycocotools missing, non-numeric image ids, ids absent from the ground truth.
    """
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        LOGGER.warning("warning: pycocotools is not installed; pip install pycocotools for the COCO table")
        return None
    if not all(isinstance(i, int) for i in image_ids):
        LOGGER.warning("warning: image file names are not numeric COCO ids; pycocotools evaluation skipped")
        return None
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # pycocotools prints; keep its table for our log only
            gt = COCO(str(anno_json))
            ev = COCOeval(gt, gt.loadRes(str(pred_json)), "bbox")
            ev.params.imgIds = sorted(set(image_ids) & set(gt.getImgIds()))
            ev.evaluate()
            ev.accumulate()
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            ev.summarize()
    except Exception as e:  # pycocotools signals bad input with bare asserts and KeyErrors
        LOGGER.warning(f"warning: pycocotools could not evaluate {pred_json} against {anno_json} "
                       f"({type(e).__name__}: {str(e)[:120]}); our metrics above stand")
        return None
    LOGGER.info(f"pycocotools ({Path(anno_json).name}):\n{table.getvalue().rstrip()}")
    return {"map": float(ev.stats[0]), "map50": float(ev.stats[1]), "stats": [float(s) for s in ev.stats]}


def _output_dir(opt: EvalOptions) -> Path | None:
    """Where files go: the caller's save_dir, else runs/test/exp{N}; None when nothing is written."""
    if not (opt.plots or opt.save_txt or opt.save_json):
        return Path(opt.save_dir) if opt.save_dir else None
    path = Path(opt.save_dir) if opt.save_dir else increment_path(opt.project, opt.name, exist_ok=opt.exist_ok)
    folder = path / "labels" if opt.save_txt else path
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output folder {folder}: {e.strerror or e}; choose another --project") from None
    return path


def _finish(res: ValResult, ap: APResult | None, acc: _Accumulator, names: list[str], data: dict,
            weights: str | Path | None) -> None:
    """Print the tables, draw the plots, write the JSON and run pycocotools on it."""
    opt, save_dir = acc.opt, acc.save_dir
    if opt.task != "speed":
        _print_table(res, ap, acc, names)
    _print_speed(res.speed, acc.batch_shape)
    if save_dir is not None and opt.plots:
        _plot(save_dir, acc, ap, names)
    if opt.save_json and save_dir is not None:
        pred_json = save_dir / f"{'+'.join(Path(w).stem for w in _as_list(weights)) or 'model'}_predictions.json"
        text = json.dumps(acc.jdict).encode()
        atomic_write(pred_json, lambda f: f.write(text), fix="free disk space or choose another --project")
        LOGGER.info(f"saved {len(acc.jdict)} predictions to {pred_json}")
        if data.get("annotations") and acc.jdict:
            res.coco = coco_evaluate(Path(data["annotations"]), pred_json, acc.image_ids)
    if save_dir is not None and (opt.plots or opt.save_json or opt.save_txt):
        LOGGER.info(f"results saved to {save_dir}")


def weights_label(weights: str | Path | list | None) -> str:
    """The weights for messages: the file, or the files of an ensemble joined with ' + '."""
    return " + ".join(str(w) for w in _as_list(weights))


def _as_list(weights: str | Path | list | None) -> list:
    return list(weights) if isinstance(weights, (list, tuple)) else [] if weights is None else [weights]


def run(data: str | Path | dict = str(DEFAULT_DATA_FILE), weights: str | Path | list | None = None, *,
        model: nn.Module | None = None, dataloader=None, compute_loss: Callable | None = None, **options) -> ValResult:
    """Evaluate `weights` (a checkpoint; a list: an ensemble) or the live `model` on a split of `data`; `options` are EvalOptions
    fields. Live mode (train.py) passes its own `dataloader` and `compute_loss` (the validation loss)."""
    return evaluate(EvalOptions(data=data, weights=weights, **options), model, dataloader, compute_loss)


def evaluate(opts: EvalOptions, model: nn.Module | None = None, dataloader=None,
             compute_loss: Callable | None = None) -> ValResult:
    opt = opts.checked()
    acc, data, names = accumulate(opt, model, dataloader, compute_loss)
    res, ap = _summarise(acc)
    _finish(res, ap, acc, names, data, opt.weights)
    return res


def accumulate(opt: EvalOptions, model: nn.Module | None = None, dataloader=None,
               compute_loss: Callable | None = None) -> tuple[_Accumulator, dict, list[str]]:
    """The evaluation up to its figures: (every image's statistics in `.stats`, the data config, class names).
    `opt` has been checked."""
    data = _load_data(opt.data)
    if dataloader is None:
        _split(data, opt.task)
    net, dev, dtype, ckpt_names = _prepare_model(opt.weights, model, opt.device, opt.half)
    label = weights_label(opt.weights) if model is None else "the model"
    nc = _check_classes(net, data, opt.single_cls, label)
    names = ["item"] if opt.single_cls else list(data["names"])
    if ckpt_names and not opt.single_cls and ckpt_names != names:
        LOGGER.warning(f"warning: {label} was trained with class names {ckpt_names[:3]}... but the data names "
                       f"{names[:3]}...; results are reported under the data's names")
    if dataloader is None:
        stride = max(int(de_parallel(net).stride.max()), 32)
        suggested = (data.get("defaults") or {}).get("imgsz")
        size, why = default_imgsz(opt.imgsz, net, int(suggested or 640),
                                  "the dataset's suggested size" if suggested else "the default")
        imgsz = round_imgsz(fixed_imgsz(net, size), stride)
        check_imgsz((imgsz, imgsz), opt.batch_size, training=False, device=dev)
        LOGGER.info(f"evaluating {label} at {imgsz} px ({why})")
        dataloader = _make_loader(data, opt.task, imgsz, opt.batch_size, stride, opt.single_cls, opt.workers,
                                  rect_ok=not getattr(net, "static", False))
    acc = _Accumulator(nc, data, _output_dir(opt), opt, dev)
    previews = PreviewThread() if opt.plots and acc.save_dir is not None else None
    try:
        with torch.inference_mode():
            _evaluate(net, dataloader, dev, dtype, acc, compute_loss, _batch_pictures(previews, names, acc.save_dir))
    finally:
        if previews is not None:
            previews.close()  # every picture is written before the charts and before run() returns
    return acc, data, names
