"""The YOLOv5 detector: the Detect head and a Model assembled from a YAML layer list.

A model YAML holds `nc`, `depth_multiple`, `width_multiple`, `anchors` and two layer lists,
`backbone` and `head`, whose rows are `[from, number, module, args]`. The YAML is read with
`yaml.safe_load` and module names are looked up in `MODULES`; nothing in the file is evaluated.
"""
from __future__ import annotations

import copy
import functools
import inspect
import logging
import math
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.common import C3, SPPF, Bottleneck, Concat, Conv, autopad
from utils.engine.amp import inference_dtype, prepare_inference
from utils.engine.checkpoint import load_checkpoint
from utils.errors import UserError
from utils.files import load_yaml, resolve_weights
from utils.interop.backends import Backend, Ensemble, PyTorchBackend, is_exported, load_exported
from utils.limits import MAX_CLASSES, TooLarge, check_expanded

LOGGER = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).resolve().parent

# Objectness prior: about 8 objects per 640x640 image, spread over the cells of each level.
OBJECTS_PER_IMAGE = 8
PRIOR_IMAGE_SIZE = 640
# Class prior: probability 0.6 spread over (nc - 0.99) classes; the 0.99 keeps nc=1 finite.
CLASS_PRIOR = 0.6
# Square input for the dummy forward that measures each level's stride; any multiple of 32 works.
STRIDE_PROBE_SIZE = 128
# Test-time augmentation: (scale, left-right flip) per pass.
TTA_PASSES = ((1.0, False), (0.83, True), (0.67, False))
# Padding grey for rescaled TTA images: the letterbox colour 114/255.
PAD_VALUE = 114 / 255
UPSAMPLE_MODES = ("nearest", "bilinear", "bicubic")
# Size bounds of a model YAML (from --cfg or inside a checkpoint), checked before anything is built. The
# largest official model, yolov5x, has depth 1.33, width 1.25, 1280 channels, 25 layers, 86 M parameters.
MAX_DEPTH_MULTIPLE = 10.0
MAX_WIDTH_MULTIPLE = 10.0
MAX_CHANNELS = 8192  # output channels of one layer, after width_multiple
MAX_INPUT_CHANNELS = 64  # 'ch': 3 for colour pictures
MAX_LAYERS = 1000  # rows of backbone + head
MAX_REPEATS = 100  # one row's number, after depth_multiple
MAX_BLOCKS = 2000  # all repeats of all rows together
MAX_PARAMETERS = 1_000_000_000  # 4 GB in FP32
MAX_PROBE_ELEMENTS = 50_000_000  # values of all layer outputs for one STRIDE_PROBE_SIZE image (200 MB)


def make_divisible(x: float, divisor: int = 8) -> int:
    """Smallest multiple of `divisor` >= x; channel counts that are multiples of 8 run fastest."""
    return int(math.ceil(x / divisor) * divisor)


class Detect(nn.Module):
    """One 1x1 conv per pyramid level predicting na anchors x (4 box + 1 objectness + nc classes).

    `anchors` is a buffer in GRID units (pixels / stride), shape (nl, na, 2); `stride` is a
    non-persistent buffer so it follows `.to()` without adding a key that YOLOv5 state dicts lack.
    """

    def __init__(self, nc: int = 80, anchors: list[list[float]] = (), ch: list[int] = ()) -> None:
        super().__init__()
        if not anchors or len({len(a) for a in anchors}) != 1 or len(anchors[0]) % 2:
            raise ValueError("anchors must be one list of (w, h) pairs per level, same count on every level")
        if len(anchors) != len(ch):
            raise ValueError(f"{len(anchors)} anchor levels but {len(ch)} input layers")
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, self.na, 2))
        self.register_buffer("stride", torch.zeros(self.nl), persistent=False)
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        # Per level: ((ny, nx, device), grid). Rebuilt whenever the map size or device changes.
        self._grid_cache: list[tuple[tuple, torch.Tensor] | None] = [None] * self.nl

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        raw = []
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            raw.append(x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())
        if self.training:
            return raw
        return torch.cat([self._decode(i, r) for i, r in enumerate(raw)], 1), raw

    def _decode(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Raw map (bs, na, ny, nx, no) -> (bs, na*ny*nx, no) boxes in input pixels, scores in [0, 1].

        The math runs in FP32 (bf16 holds only 8 significant bits, too few for pixel positions on
        large maps) and the result is cast back to the map's dtype, which the contract promises.
        """
        bs, _, ny, nx, _ = x.shape
        stride = self.stride[i].float()
        grid = self._grid(i, ny, nx, x.device)
        anchor_px = (self.anchors[i].float() * stride).view(1, self.na, 1, 1, 2)
        xy, wh, scores = x.float().sigmoid().split((2, 2, self.no - 4), -1)
        xy = (xy * 2 + grid) * stride  # grid already holds the -0.5 offset
        wh = (wh * 2) ** 2 * anchor_px
        return torch.cat((xy, wh, scores), -1).view(bs, -1, self.no).to(x.dtype)

    def _grid(self, i: int, ny: int, nx: int, device: torch.device) -> torch.Tensor:
        """Cell offsets minus 0.5, shape (1, 1, ny, nx, 2) FP32 on `device`, cached per level."""
        key = (ny, nx, device)
        cached = self._grid_cache[i]
        # An export (torch.jit.trace, torch.onnx/torch.export) must record how the grid is built from the
        # map size, not a cached constant: dynamic-shape exports would otherwise keep one map size.
        exporting = torch.jit.is_tracing() or getattr(torch.compiler, "is_exporting", lambda: False)()  # torch < 2.6
        if exporting or cached is None or cached[0] != key:
            # Built outside inference mode so a grid cached under inference_mode stays usable later.
            with torch.inference_mode(False):
                yv, xv = torch.meshgrid(torch.arange(ny, device=device, dtype=torch.float32),
                                        torch.arange(nx, device=device, dtype=torch.float32), indexing="ij")
                grid = (torch.stack((xv, yv), -1) - 0.5).view(1, 1, ny, nx, 2)
            if exporting:
                return grid
            cached = self._grid_cache[i] = (key, grid)
        return cached[1]


# Every module a YAML may name. Nothing outside this table can be constructed.
MODULES: dict[str, type[nn.Module]] = {
    "Conv": Conv,
    "Bottleneck": Bottleneck,
    "C3": C3,
    "SPPF": SPPF,
    "Concat": Concat,
    "Detect": Detect,
    "nn.Upsample": nn.Upsample,
    "Upsample": nn.Upsample,
}
# Modules whose first arg is an output channel count (scaled by width_multiple).
_CHANNEL_MODULES = (Conv, Bottleneck, C3, SPPF)
# Modules that read several earlier layers (`from` is a list).
_MULTI_INPUT_MODULES = (Concat, Detect)


def model_name(cfg: dict) -> str:
    """The name of a model config for messages: 'yolov5n' ... 'yolov5x' when it is one of models/'s architectures
    (whatever its nc and anchors: a checkpoint's YAML, ours or YOLOv5's, holds no file name), else a description."""
    def shape(d: dict) -> tuple:
        return (float(d.get("depth_multiple", 1.0)), float(d.get("width_multiple", 1.0)), repr(d.get("backbone")),
                repr(d.get("head")))

    try:
        key = shape(cfg)
    except (TypeError, ValueError):
        return "a custom model"
    for path, ref in _shipped_configs():
        if shape(ref) == key:
            return path.stem
    return f"a custom model (depth {key[0]:g}, width {key[1]:g})"


@functools.lru_cache(maxsize=1)
def _shipped_configs() -> tuple[tuple[Path, dict], ...]:
    return tuple((p, load_yaml(p, "model config")) for p in sorted(MODELS_DIR.glob("yolov5*.yaml")))


def load_model_yaml(cfg: str | Path | dict) -> tuple[dict, str]:
    """The model config as a fresh dict, plus a name for messages (the file path, or model_name of a dict).

    A bare name such as 'yolov5n' or 'yolov5n.yaml' that is not an existing file resolves to models/.
    """
    if isinstance(cfg, dict):
        return copy.deepcopy(cfg), model_name(cfg)
    path = Path(cfg)
    if not path.is_file() and len(path.parts) == 1:
        path = MODELS_DIR / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    if not path.is_file():
        raise UserError(f"model config {cfg} not found; pass a model YAML path or one of "
                        f"yolov5n/s/m/l/x.yaml from {MODELS_DIR}")
    return load_yaml(path, "model config"), str(path)


def _check_top_level(d: dict, source: str) -> None:
    """Fail with one line naming the file when a required top-level key is missing or malformed."""
    fix = "compare with models/yolov5s.yaml"
    try:
        check_expanded(d, MAX_LAYERS * 200, "model config values")  # a checkpoint's pickle can share lists
    except TooLarge as e:
        raise UserError(f"{source}: refused, {e}; {fix}") from None
    nc = d.get("nc")
    if isinstance(nc, bool) or not isinstance(nc, int) or not 1 <= nc <= MAX_CLASSES:
        raise UserError(f"{source}: nc must be a whole number from 1 to {MAX_CLASSES}, got {str(nc)[:40]!r}; {fix}")
    for key, limit in (("depth_multiple", MAX_DEPTH_MULTIPLE), ("width_multiple", MAX_WIDTH_MULTIPLE)):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= limit:
            raise UserError(f"{source}: {key} must be a number above 0 and at most {limit:g}, got {str(v)[:40]!r}; {fix}")
    c = d.get("ch", 3)
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_INPUT_CHANNELS:
        raise UserError(f"{source}: ch (input channels) must be a whole number from 1 to {MAX_INPUT_CHANNELS}, "
                        f"got {str(c)[:40]!r}; {fix}")
    for key in ("backbone", "head"):
        if not isinstance(d.get(key), list):
            raise UserError(f"{source}: '{key}' must be a list of [from, number, module, args] rows; {fix}")
    if len(d["backbone"]) + len(d["head"]) > MAX_LAYERS:
        raise UserError(f"{source}: {len(d['backbone']) + len(d['head'])} layers; at most {MAX_LAYERS} are supported")


def _check_layer(layer: Any, i: int, where: str) -> tuple[int | list[int], int, type[nn.Module], list]:
    """Validate one `[from, number, module, args]` row and return it with the module class looked up."""
    if not isinstance(layer, (list, tuple)) or len(layer) != 4:
        raise UserError(f"{where}: expected [from, number, module, args], got {layer!r}; fix the row")
    f, n, name, args = layer
    if not isinstance(name, str) or name not in MODULES:
        raise UserError(f"{where}: unknown module {name!r}; use one of {', '.join(MODULES)}")
    module = MODULES[name]
    froms = f if isinstance(f, list) else [f]
    if not froms or not all(isinstance(j, int) and not isinstance(j, bool) and -i <= j < i or j == -1
                            for j in froms):
        raise UserError(f"{where}: 'from' {f!r} must be -1 or indices of earlier layers; fix the row")
    if i == 0 and f != -1:
        raise UserError(f"{where}: the first layer must read the input (from = -1); fix the row")
    if isinstance(f, list) != (module in _MULTI_INPUT_MODULES):
        kind = "a list of layers" if module in _MULTI_INPUT_MODULES else "a single layer index"
        raise UserError(f"{where}: {name} needs 'from' to be {kind}, got {f!r}; fix the row")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or not isinstance(args, list):
        raise UserError(f"{where}: number must be a positive integer and args a list; fix the row")
    return f, n, module, args


def _resolve_arg(a: Any, d: dict, where: str) -> Any:
    """Map the names a YAML may use in args to values; any other string is an error."""
    if not isinstance(a, str):
        return a
    if a in ("nc", "anchors"):
        if a not in d:
            raise UserError(f"{where}: args name {a!r} but the YAML has no top-level '{a}'; add it")
        return d[a]
    if a == "None":
        return None
    if a in UPSAMPLE_MODES:
        return a
    raise UserError(f"{where}: unknown argument {a!r}; use numbers, booleans, nc, anchors, None "
                    f"or an upsample mode ({', '.join(UPSAMPLE_MODES)})")


def _layer_args(module: type[nn.Module], f: int | list[int], n: int, args: list, ch: list[int],
                ch_in: int, gw: float) -> tuple[list, int, int | None]:
    """Constructor args with channels filled in; returns (args, repeats, output channels)."""
    c1 = ch_in if not ch else None if isinstance(f, list) else ch[f]
    if module in _CHANNEL_MODULES:
        if not args or isinstance(args[0], bool) or not isinstance(args[0], (int, float)) or \
                not 0 < args[0] * gw <= MAX_CHANNELS:
            raise ValueError(f"output channels x width_multiple must lie in 1..{MAX_CHANNELS}")
        c2 = make_divisible(args[0] * gw, 8)
        args = [c1, c2, *args[1:]]
        if module is C3:  # C3 repeats its bottlenecks inside, so the repeat count becomes an arg
            args.insert(2, n)
            n = 1
        return args, n, c2
    if module is Concat:
        return args, n, sum(ch[j] for j in f)
    if module is Detect:
        return [*args, [ch[j] for j in f]], n, None
    return args, n, c1


def _int_pair(v: Any, name: str) -> tuple[int, int]:
    """An int or a pair of ints (kernel, stride, padding, size) as (along h, along w)."""
    pair = list(v) if isinstance(v, (list, tuple)) else [v, v]
    if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair):
        raise ValueError(f"{name} must be a whole number or a pair of them, got {v!r}")
    return pair[0], pair[1]


def _out_hw(module: type[nn.Module], args: list, f: int | list[int], hw: list[tuple[int, int]],
            hw_in: tuple[int, int]) -> tuple[int, int]:
    """Map size (h, w) a layer puts out for the stride probe, worked out from its args alone, so a config
    whose maps grow without bound (an upsample by 10**4, a padding of 10**6) is refused before anything
    runs. Raises ValueError when the layer cannot run (a map shrunk to nothing, a Concat of unequal maps)."""
    h, w = hw_in if not hw else hw[f] if not isinstance(f, list) else hw[f[0]]
    a = inspect.signature(module).bind(*args).arguments  # TypeError for args the module does not take
    if module is Conv:
        (kh, kw), (sh, sw), (dh, dw) = _int_pair(a.get("k", 1), "k"), _int_pair(a.get("s", 1), "s"), \
            _int_pair(a.get("d", 1), "d")
        p = a.get("p")
        ph, pw = (autopad(kh, None, dh), autopad(kw, None, dw)) if p is None else _int_pair(p, "p")
        if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
            raise ValueError("kernel, stride and dilation must be 1 or more, padding 0 or more")
        h, w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    elif module is SPPF:
        k = a.get("k", 5)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError("SPPF's k must be a whole number, 1 or more")
        h, w = h + 3 * (2 * (k // 2) - k + 1), w + 3 * (2 * (k // 2) - k + 1)  # three k x k pools, padding k // 2
    elif module is Concat:
        if a.get("dimension", 1) not in (1, -3):
            raise ValueError("Concat joins channels: its argument must be 1")
        sizes = {hw[j] for j in f}
        if len(sizes) != 1:
            raise ValueError(f"Concat of maps of different sizes {sorted(sizes)}; check 'from'")
    elif module is nn.Upsample:
        if a.get("mode", "nearest") not in UPSAMPLE_MODES:
            raise ValueError(f"Upsample mode {str(a.get('mode'))[:20]!r} is not one of {', '.join(UPSAMPLE_MODES)} "
                             f"(YOLOv5's is 'nearest')")
        if a.get("align_corners") and a.get("mode", "nearest") not in ("bilinear", "bicubic"):
            raise ValueError("Upsample align_corners applies to the bilinear and bicubic modes only")
        if a.get("size") is not None:
            h, w = _int_pair(a["size"], "size")
        else:
            sf = a.get("scale_factor")
            sy, sx = (list(sf) + [None])[:2] if isinstance(sf, (list, tuple)) else (sf, sf)
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1e6 for x in (sy, sx)):
                raise ValueError("Upsample needs a positive scale factor (e.g. 2) or a size")
            h, w = math.floor(h * sy), math.floor(w * sx)
    if min(h, w) < 1:
        raise ValueError(f"the map shrinks to nothing ({h}x{w}) for a {STRIDE_PROBE_SIZE} px input")
    return h, w


def parse_model(d: dict, ch_in: int, source: str) -> tuple[nn.Sequential, list[int]]:
    """Build the layers of a model dict. Returns (layers, sorted indices whose outputs are reused).

    Every row is checked against the size bounds (MAX_*) before its module is made; `check_model_size`
    runs this on the meta device first, so an oversized config is refused before any memory is taken."""
    _check_top_level(d, source)
    gd, gw = d["depth_multiple"], d["width_multiple"]
    layers: list[nn.Module] = []
    save: set[int] = set()
    ch: list[int] = []  # output channels of each layer so far
    hw: list[tuple[int, int]] = []  # map size of each layer so far, for a STRIDE_PROBE_SIZE input
    blocks = elements = 0
    rows = d["backbone"] + d["head"]
    for i, row in enumerate(rows):
        where = f"{source} layer {i}"
        f, n, module, args = _check_layer(row, i, where)
        args = [_resolve_arg(a, d, where) for a in args]
        if n > MAX_REPEATS or n * gd > MAX_REPEATS:
            raise UserError(f"{where}: number {n} x depth_multiple {gd:g} is over {MAX_REPEATS} repeats; fix the row")
        n = max(round(n * gd), 1) if n > 1 else n
        blocks += n
        if blocks > MAX_BLOCKS:
            raise UserError(f"{source}: more than {MAX_BLOCKS} blocks in all (numbers x depth_multiple); make it smaller")
        try:
            args, n, c2 = _layer_args(module, f, n, args, ch, ch_in, gw)
            size = _out_hw(module, args, f, hw, (STRIDE_PROBE_SIZE, STRIDE_PROBE_SIZE))
            elements += (c2 or 0) * size[0] * size[1] * n
            if elements > MAX_PROBE_ELEMENTS:
                raise UserError(f"{where}: the layer maps grow too large ({elements:,} values for one "
                                f"{STRIDE_PROBE_SIZE} px image, limit {MAX_PROBE_ELEMENTS:,}); fix the args")
            m = nn.Sequential(*(module(*args) for _ in range(n))) if n > 1 else module(*args)
        except (TypeError, ValueError, IndexError, KeyError, RuntimeError, OverflowError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{where}: cannot build {row[2]} with args {str(row[3])[:80]} ({reason[:160]}); "
                            f"fix the args") from None
        hw.append(size)
        if module is Detect and i != len(rows) - 1:
            raise UserError(f"{where}: Detect must be the last layer; move it to the end of 'head'")
        m.i, m.f = i, f
        m.np = sum(p.numel() for p in m.parameters())
        save.update(j % i for j in (f if isinstance(f, list) else [f]) if j != -1)
        layers.append(m)
        ch.append(c2)
    if not layers or not isinstance(layers[-1], Detect):
        raise UserError(f"{source}: the last layer of 'head' must be Detect; compare with models/yolov5s.yaml")
    return nn.Sequential(*layers), sorted(save)


def check_model_size(d: dict, ch_in: int, source: str) -> int:
    """Refuse (one UserError line) a model config over the size bounds, before any real memory is taken:
    the rows are checked one by one (multipliers, channels, repeats, layer and block counts, map sizes)
    and the layers are then made on the meta device, where parameters take no memory, to count them.
    Returns the parameter count."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: a model config must be a mapping, not {type(d).__name__}")
    with torch.device("meta"):
        layers, _ = parse_model(d, ch_in, source)
    n = sum(p.numel() for p in layers.parameters())
    if n > MAX_PARAMETERS:
        raise UserError(f"{source}: {n:,} parameters; at most {MAX_PARAMETERS:,} are supported "
                        f"(yolov5x has 86 M); lower width_multiple or the channel counts")
    return n


class Model(nn.Module):
    """YOLOv5 detector built from a YAML config; `model.model[-1]` is the Detect head."""

    def __init__(self, cfg: str | Path | dict = "yolov5s.yaml", ch: int = 3, nc: int | None = None) -> None:
        super().__init__()
        self.yaml, self.yaml_file = load_model_yaml(cfg)
        # A saved config (checkpoint) records its input channels; otherwise the argument decides.
        ch = self.yaml.setdefault("ch", ch)
        if nc is not None and nc != self.yaml.get("nc"):
            LOGGER.info(f"overriding {self.name} nc={self.yaml.get('nc')} with nc={nc}")
            self.yaml["nc"] = nc
        check_model_size(self.yaml, ch, self.yaml_file)
        self.model, self.save = parse_model(self.yaml, ch, self.yaml_file)
        self.nc: int = self.yaml["nc"]
        self._init_strides(ch)
        self.initialize_biases()

    @property
    def name(self) -> str:
        """The config's name for messages: its file's stem, or model_name of a dict (a checkpoint's YAML)."""
        return Path(self.yaml_file).stem if str(self.yaml_file).endswith((".yaml", ".yml")) else self.yaml_file

    @property
    def stride(self) -> torch.Tensor:
        """Stride of each output level, e.g. tensor([8., 16., 32.])."""
        return self.model[-1].stride

    def _run_layers(self, x: torch.Tensor, layers: nn.Sequential) -> tuple[Any, list]:
        """Run layers in order, keeping only the outputs that a later `from` refers to."""
        y: list[torch.Tensor | None] = []
        for m in layers:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x, y

    @torch.no_grad()
    def _init_strides(self, ch: int) -> None:
        """Measure each level's stride with a dummy forward, then store anchors in grid units."""
        detect = self.model[-1]
        training = self.training
        self.eval()  # eval: the probe must not touch BatchNorm running statistics
        _, y = self._run_layers(torch.zeros(1, ch, STRIDE_PROBE_SIZE, STRIDE_PROBE_SIZE), self.model[:-1])
        self.train(training)
        detect.stride = torch.tensor([STRIDE_PROBE_SIZE / y[j].shape[-2] for j in detect.f])
        # Anchors must grow with stride (small anchors on the fine level); a YAML listing them the
        # other way round would pair big anchors with small cells, so flip them.
        area = detect.anchors.prod(-1).mean(-1)
        if (area[-1] - area[0]).sign() != (detect.stride[-1] - detect.stride[0]).sign():
            LOGGER.info(f"{self.name}: reversing anchor order to match strides")
            detect.anchors.copy_(detect.anchors.flip(0))
        detect.anchors.div_(detect.stride.view(-1, 1, 1))

    @torch.no_grad()
    def initialize_biases(self) -> None:
        """Start objectness and class logits at their priors, so early training is not swamped by
        confident false positives (Focal Loss paper, sec. 3.3)."""
        detect = self.model[-1]
        for conv, s in zip(detect.m, detect.stride.tolist()):
            b = conv.bias.view(detect.na, detect.no)
            b[:, 4] = math.log(OBJECTS_PER_IMAGE / (PRIOR_IMAGE_SIZE / s) ** 2)
            b[:, 5:] = math.log(CLASS_PRIOR / (detect.nc - 0.99))

    def forward(self, x: torch.Tensor, augment: bool = False) -> Any:
        """Train mode: list of raw maps (bs, na, ny, nx, no). Eval mode: (pred (bs, N, no), raw maps).
        augment=True (eval only): flip + scale test-time augmentation, returns (pred, None)."""
        if augment:
            if self.training:
                raise ValueError("test-time augmentation needs eval mode; call model.eval() first")
            return self._forward_augment(x)
        return self._run_layers(x, self.model)[0]

    def _forward_augment(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Predict on the image, a smaller flipped copy and a smaller copy; map all back and concatenate."""
        h, w = x.shape[-2:]
        gs = int(self.stride.max())
        preds = []
        for scale, flip in TTA_PASSES:
            xi = x.flip(-1) if flip else x
            xi, (ry, rx) = _scale_image(xi, scale, gs)
            pred = self._run_layers(xi, self.model)[0][0]
            box = pred[..., :4] / pred.new_tensor([rx, ry, rx, ry])
            if flip:  # flipped before scaling, so the mirror axis is the original width
                box = torch.cat((w - box[..., :1], box[..., 1:]), -1)
            preds.append(torch.cat((box, pred[..., 4:]), -1))
        return torch.cat(preds, 1), None

    def fuse(self) -> Model:
        """Fold every BatchNorm into its conv (for inference; BN statistics stop updating)."""
        for m in self.model.modules():
            if isinstance(m, Conv):
                m.fuse_bn()
        return self

    def info(self, imgsz: int = 640) -> str:
        """One line: layers, parameters, parameters with gradients, GFLOPs for an imgsz square image."""
        n_p = sum(p.numel() for p in self.parameters())
        n_g = sum(p.numel() for p in self.parameters() if p.requires_grad)
        layers = len(list(self.modules()))
        return (f"{self.name} summary: {layers} layers, {n_p:,} parameters, {n_g:,} gradients, "
                f"{self.flops(imgsz) / 1e9:.2f} GFLOPs at {imgsz}px")

    @torch.no_grad()
    def flops(self, imgsz: int = 640) -> float:
        """Convolution FLOPs (2 x multiply-accumulates) of one forward at imgsz x imgsz.

        Counted on a small probe image and scaled by area: every conv output scales with the input
        area, so this is exact for sizes that are multiples of the largest stride.
        """
        probe = 2 * int(self.stride.max())
        total = 0

        def count(m: nn.Conv2d, _inputs: Any, out: torch.Tensor) -> None:
            nonlocal total
            total += 2 * out.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)

        hooks = [m.register_forward_hook(count) for m in self.modules() if isinstance(m, nn.Conv2d)]
        p = next(self.parameters())
        training = self.training
        try:
            self.eval()
            self._run_layers(torch.zeros(1, self.yaml["ch"], probe, probe, device=p.device, dtype=p.dtype), self.model)
        finally:
            self.train(training)
            for h in hooks:
                h.remove()
        return total * (imgsz / probe) ** 2


def _scale_image(x: torch.Tensor, scale: float, gs: int) -> tuple[torch.Tensor, tuple[float, float]]:
    """Resize a batch by `scale`, then pad right/bottom to a multiple of gs (box coordinates do not move).
    Returns the image and the exact (y, x) ratios used, for mapping predictions back."""
    if scale == 1.0:
        return x, (1.0, 1.0)
    h, w = x.shape[-2:]
    nh, nw = int(h * scale), int(w * scale)
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    ph, pw = math.ceil(nh / gs) * gs, math.ceil(nw / gs) * gs
    return F.pad(x, (0, pw - nw, 0, ph - nh), value=PAD_VALUE), (nh / h, nw / w)


# ---------------------------------------------------------------------------------------------
# a Model from a checkpoint (utils/engine/checkpoint.py owns the file format; building the model is ours)


def build_model(ckpt: dict[str, Any], weights: str = "model", source: str | Path = "checkpoint") -> nn.Module:
    """An FP32 Model from a checkpoint's YAML, with the state dict named by `weights` loaded."""
    model = Model(ckpt["yaml"], nc=ckpt["nc"])
    state = ckpt["model"] if weights == "model" else ckpt["train"][weights]
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"weights in {source} do not fit its model YAML ({str(e).splitlines()[0][:120]}); "
                        f"the file is damaged or was edited") from None
    return model.float()


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """(FP32 model in eval mode on `device`, checkpoint dict). Callers pick the inference dtype afterwards."""
    ckpt = load_checkpoint(path)
    model = build_model(ckpt, source=path)
    return model.to(device).eval(), ckpt


def load_for_inference(weights: str | Path | Sequence[str | Path], device: torch.device,
                       half: bool | None = None) -> Backend:
    """The one loader of weights for inference (test.py, detect.py, models/api.py), as a utils.interop.backends.Backend:
    an exported .onnx / .torchscript file through its runtime, a checkpoint (ours or YOLOv5's) as the fused model in
    the inference dtype on `device` (BN folded in FP32, then the model cast). Several files (a list) make an
    Ensemble of checkpoints; one file in a list is that file alone."""
    if not isinstance(weights, (list, tuple)):
        return _load_one(resolve_weights(weights), device, half)
    if not weights:
        raise UserError("--weights names no file; pass one checkpoint, or several for an ensemble")
    paths = [resolve_weights(w) for w in weights]  # a missing file is reported before anything loads
    if len(paths) == 1:
        return _load_one(paths[0], device, half)
    exported = next((p for p in paths if is_exported(p)), None)
    if exported is not None:  # each runtime has its own static sizes and precision: not worth mixing
        raise UserError(f"{exported} is an exported graph, and ensembles take .pt checkpoints only; pass the "
                        f"checkpoints it was exported from")
    return Ensemble([_load_one(p, device, half) for p in paths])


def _load_one(path: Path, device: torch.device, half: bool | None) -> Backend:
    if is_exported(path):
        return load_exported(path, device, half)
    dtype = inference_dtype(device, half)  # before loading: a refused --half should not wait for the model
    model, ckpt = load_model(path, device)
    names = list(ckpt.get("names") or [str(i) for i in range(ckpt["nc"])])
    return inference_backend(model, path, device, dtype, names, ckpt.get("imgsz"))


def inference_backend(model: nn.Module, path: Path, device: torch.device, dtype: torch.dtype, names: list[str],
                      trained_imgsz: int | None = None) -> PyTorchBackend:
    """An FP32 Model as a Backend for inference: BN folded in FP32, then cast to `dtype` (utils.engine.amp's
    inference_dtype) on `device`. `path` names where it came from (a checkpoint, or the YAML of an untrained model)."""
    return PyTorchBackend(path, prepare_inference(model.fuse(), device, dtype), device, dtype, names, trained_imgsz)
