"""Building blocks of the YOLOv5 architecture: Conv, Bottleneck, C3, SPPF, Concat.

Attribute names (`conv`, `bn`, `act`, `cv1`, `cv2`, `cv3`, `m`) are part of the state-dict layout,
so YOLOv5 weights map onto these modules key for key. Do not rename them.
"""
from __future__ import annotations

import torch
from torch import nn

# YOLOv5's BatchNorm settings; the published weights were trained with them, and the small momentum
# keeps running statistics stable with the small per-GPU batches detectors train with.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(k: int | list[int], p: int | list[int] | None = None, d: int = 1) -> int | list[int]:
    """Padding that keeps the spatial size for stride 1 ('same'), given kernel k and dilation d."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU. After `fuse_bn()` the BN lives inside the conv."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1,
                 d: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn: nn.BatchNorm2d | None = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is None:  # fused for inference
            return self.forward_fuse(x)
        return self.act(self.bn(self.conv(x)))

    def forward_fuse(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))

    @torch.no_grad()
    def fuse_bn(self) -> None:
        """Fold the BatchNorm's affine transform and running statistics into the conv weights.

        BN(conv(x)) = gamma * (W x - mean) / sqrt(var + eps) + beta, which is a conv with weights
        W * gamma / std and bias beta - mean * gamma / std. Computed in FP32, stored in the conv's dtype.
        """
        if self.bn is None:
            return
        conv, bn = self.conv, self.bn
        w = conv.weight.float()
        scale = bn.weight.float() / torch.sqrt(bn.running_var.float() + bn.eps)
        bias = bn.bias.float() - bn.running_mean.float() * scale
        if conv.bias is not None:
            bias = bias + conv.bias.float() * scale
        fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                          dilation=conv.dilation, groups=conv.groups, bias=True)
        fused.weight.copy_(w * scale.view(-1, 1, 1, 1))
        fused.bias.copy_(bias)
        fused = fused.to(device=conv.weight.device, dtype=conv.weight.dtype)
        self.conv = fused.requires_grad_(conv.weight.requires_grad)
        self.bn = None


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3, with a residual add when shapes allow it."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block with 3 convs: one branch runs n Bottlenecks, the other is a plain 1x1; then merge.

    Splitting the channels halves the Bottleneck cost while the bypass keeps gradients flowing.
    """

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast form: three chained k x k max-pools instead of parallel
    k, 2k-1, 3k-2 pools; chaining gives the same receptive fields at a fraction of the cost."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along `dimension` (channels by default)."""

    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)
