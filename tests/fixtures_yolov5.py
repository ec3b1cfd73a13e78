"""Writes checkpoints the way YOLOv5 saves them, in a separate Python process where this repository's
`models` package is NOT importable: the process registers stand-in modules named `models.yolo` /
`models.common` (or `yolov5.models.*`, or Ultralytics' names), builds a small YOLOv5-style model from a
YAML dict with classes of those names, and pickles {'model': model.half(), 'ema': ..., 'epoch': ...}.

Run by tests/test_yolov5_import.py as `python -I fixtures_yolov5.py SPEC_JSON` from a temporary folder.
This file imports nothing from the repository. Written for the tests; the architecture follows the
published YOLOv5 P5 design (Conv = Conv2d + BatchNorm2d(eps 1e-3) + SiLU, C3, SPPF, Detect).
"""
import copy
import importlib.util
import json
import math
import os
import sys
import types

assert importlib.util.find_spec("models") is None, "this repository's models package must not be importable here"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

SPEC = json.loads(sys.argv[1])
CLASSES = SPEC["classes"]  # our short name -> the global name it is pickled under, e.g. 'models.common.Conv'


def fake_module(name: str) -> types.ModuleType:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


def register(cls: type) -> type:
    """Give `cls` the module and name it is pickled under, and put it there so pickle finds it."""
    module, name = CLASSES[cls.__name__].rsplit(".", 1)
    cls.__module__, cls.__name__, cls.__qualname__ = module, name, name
    setattr(fake_module(module), name, cls)
    return cls


SILU = nn.SiLU()  # YOLOv5 v7.0 shares one activation module (Conv.default_act) among all Convs


@register
class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, p=None, g=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = SILU

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


@register
class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1, self.cv2 = Conv(c1, c_, 1, 1), Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


@register
class C3(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1, self.cv2, self.cv3 = Conv(c1, c_, 1, 1), Conv(c1, c_, 1, 1), Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


@register
class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1, self.cv2 = Conv(c1, c_, 1, 1), Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


@register
class Concat(nn.Module):
    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


@register
class Detect(nn.Module):
    def __init__(self, nc, anchors, ch):
        super().__init__()
        self.nc, self.no, self.nl, self.na = nc, nc + 5, len(anchors), len(anchors[0]) // 2
        self.grid = [torch.empty(0) for _ in range(self.nl)]
        self.anchor_grid = [torch.empty(0) for _ in range(self.nl)]
        self.register_buffer("anchors", torch.tensor(anchors).float().view(self.nl, -1, 2))  # grid units later
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)
        self.inplace = True

    def forward(self, xs):
        out, raw = [], []
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            raw.append(x)
            yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
            cell = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float() - 0.5
            box_px = (self.anchors[i] * self.stride[i]).view(1, self.na, 1, 1, 2)
            s = x.sigmoid()
            xy = (s[..., :2] * 2 + cell) * self.stride[i]
            wh = (s[..., 2:4] * 2) ** 2 * box_px
            out.append(torch.cat((xy, wh, s[..., 4:]), -1).view(bs, -1, self.no))
        return torch.cat(out, 1), raw


@register
class DetectionModel(nn.Module):
    def __init__(self, cfg, strides, names):
        super().__init__()
        self.yaml = cfg
        self.model, self.save = build(copy.deepcopy(cfg))
        detect = self.model[-1]
        detect.stride = torch.tensor(strides, dtype=torch.float32)
        detect.anchors /= detect.stride.view(-1, 1, 1)
        self.stride = detect.stride
        self.names, self.nc, self.hyp = names, cfg["nc"], {"lr0": 0.01, "box": 0.05}

    def forward(self, x):
        y = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x


def build(d):
    """The layers of a YOLOv5 model YAML dict (channels scaled by width, repeats by depth)."""
    gd, gw, ch, layers, save = d["depth_multiple"], d["width_multiple"], [3], [], []
    table = {"Conv": Conv, "Bottleneck": Bottleneck, "C3": C3, "SPPF": SPPF, "Concat": Concat, "Detect": Detect,
             "nn.Upsample": nn.Upsample}
    for i, (f, n, name, args) in enumerate(d["backbone"] + d["head"]):
        cls = table[name]
        args = [d[a] if a in ("nc", "anchors") else None if a == "None" else a for a in args]
        n = max(round(n * gd), 1) if n > 1 else n
        if cls in (Conv, Bottleneck, C3, SPPF):
            c1, c2 = ch[f], math.ceil(args[0] * gw / 8) * 8
            args = [c1, c2, *args[1:]]
            if cls is C3:
                args.insert(2, n)
                n = 1
        elif cls is Concat:
            c2 = sum(ch[j] for j in f)
        elif cls is Detect:
            args.append([ch[j] for j in f])
            c2 = None
        else:
            c2 = ch[f]
        m = nn.Sequential(*(cls(*args) for _ in range(n))) if n > 1 else cls(*args)
        m.i, m.f, m.type = i, f, name
        save.extend(j % i for j in ([f] if isinstance(f, int) else f) if j != -1)
        layers.append(m)
        if i == 0:
            ch = []
        ch.append(c2)
    return nn.Sequential(*layers), sorted(set(save))


class Payload:
    """What an attacker adds: unpickling it calls `func(*args)`."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def randomise(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.is_floating_point() and not name.endswith("anchors"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)


def main() -> None:
    torch.manual_seed(0)
    names = SPEC["names"]  # YOLOv5 v7.0 keeps {0: 'person', ...}; JSON made the keys text
    model = DetectionModel(SPEC["yaml"], SPEC["strides"], {int(k): v for k, v in names.items()}
                           if isinstance(names, dict) else names)
    randomise(model, 1)
    if SPEC.get("autoanchor"):  # AutoAnchor replaced the YAML's anchors: only the Detect buffer knows
        model.model[-1].anchors.mul_(1.13)
    if SPEC.get("bn_eps"):
        model.model[0].bn.eps = SPEC["bn_eps"]
    if SPEC.get("control"):  # a plain unpickle, as YOLOv5 does it: runs whatever the file says
        torch.load(SPEC["control"], weights_only=False)
        return
    saved = copy.deepcopy(model).half()  # the weights the file will hold
    ref = copy.deepcopy(saved).float().eval()
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pred, _ = ref(x)
    out = SPEC["out"]
    torch.save({"state": saved.state_dict(), "input": x, "pred": pred}, out + ".ref")
    ckpt = {"epoch": -1, "best_fitness": None, "model": saved, "ema": None, "updates": None, "optimizer": None,
            "opt": {"imgsz": 640, "hyp": {"lr0": 0.01}, "save_dir": "runs/train/exp"},
            "git": {"url": None, "branch": None, "commit": None}, "date": "2024-01-02T03:04:05.000006"}
    if SPEC.get("last"):  # a training last.pt: FP16 model and EMA, optimizer, numpy best_fitness
        model_copy = copy.deepcopy(saved)
        randomise(model_copy, 7)  # the EMA is what YOLOv5 (and we) load; the raw model differs
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        ckpt.update(epoch=7, best_fitness=np.array([0.25]), model=model_copy, ema=saved, updates=123,
                    optimizer=opt.state_dict())
    payload = SPEC.get("payload")
    if payload == "os.system":
        ckpt = {"callbacks": Payload(os.system, f"touch {SPEC['marker']}"), **ckpt}
    elif payload == "eval":
        ckpt = {"callbacks": Payload(eval, f"open({SPEC['marker']!r}, 'w').close()"), **ckpt}
    elif payload == "conv2d":  # an admitted class called with arguments: 10**5 x 10**5 x 9 x 9 floats
        ckpt = {"callbacks": Payload(nn.Conv2d, 100_000, 100_000, 9), **ckpt}
    elif payload == "detect":
        ckpt = {"callbacks": Payload(Detect, 80, [[10, 13]], [8]), **ckpt}
    elif payload == "not_a_model":
        ckpt["model"] = saved.model[0]
    torch.save(ckpt, out)


if __name__ == "__main__":
    main()
