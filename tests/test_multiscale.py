"""--multi-scale sizes: range, stride multiples, determinism from (seed, epoch, step), equal on every rank, and the
sizes a run trains at."""
from __future__ import annotations

import pytest
import torch
from helpers import batch_recorder as _batch_recorder

import train
from utils.data.multiscale import multi_scale_size, rescale_batch, size_for_step, size_range, step_generator

TINY = dict(imgsz=64, batch_size=8, workers=0, amp="bf16", seed=3)
NB = 3  # tiny_data: 24 training images in batches of 8


def test_range_and_stride():
    lo, hi = size_range(640, 32)
    assert (lo, hi) == (320, 960)
    assert size_range(192, 32) == (96, 288)
    sizes = {size_for_step(640, 32, 0, 0, s) for s in range(2000)}
    assert all(s % 32 == 0 and 320 <= s <= 960 for s in sizes)
    assert sizes == set(range(320, 961, 32)), "every stride multiple in the range is reachable"


def test_odd_imgsz_and_tiny():
    lo, hi = size_range(100, 32)  # 50..150 -> 64..128
    assert (lo, hi) == (64, 128)
    assert size_range(32, 32) == (32, 32)  # 16..48: never below one stride
    assert all(size_for_step(32, 32, 1, 0, s) == 32 for s in range(20))


def test_deterministic_and_resume_exact():
    run = [size_for_step(640, 32, 7, e, s) for e in range(3) for s in range(50)]
    again = [size_for_step(640, 32, 7, e, s) for e in range(3) for s in range(50)]
    assert run == again
    # a resumed run (epoch 2 on) computes the same sizes with no state carried over
    torch.manual_seed(123)  # the global RNG does not matter
    resumed = [size_for_step(640, 32, 7, 2, s) for s in range(50)]
    assert resumed == run[100:]


def test_seed_epoch_step_all_matter():
    base = [size_for_step(640, 32, 0, 0, s) for s in range(64)]
    assert base != [size_for_step(640, 32, 1, 0, s) for s in range(64)]
    assert base != [size_for_step(640, 32, 0, 1, s) for s in range(64)]
    assert len(set(base)) > 10


def test_same_on_every_rank():
    """Each DDP rank builds its own generator from the shared (seed, epoch, step): same size everywhere."""
    ranks = [[multi_scale_size(640, 32, step_generator(3, 5, s)) for s in range(40)] for _rank in range(4)]
    assert all(r == ranks[0] for r in ranks)


def test_rescale_batch_float_and_uint8():
    x = torch.rand(2, 3, 64, 64)
    y = rescale_batch(x, 96)
    assert y.shape == (2, 3, 96, 96) and y.dtype == x.dtype
    u = (x * 255).to(torch.uint8)
    v = rescale_batch(u, 32)
    assert v.shape == (2, 3, 32, 32) and v.dtype == torch.uint8
    assert rescale_batch(x, 64) is x


def test_rescale_rect_keeps_stride():
    x = torch.rand(1, 3, 320, 640)
    y = rescale_batch(x, 480, stride=32)
    assert y.shape[-2:] == (256, 480)  # 320 * 0.75 = 240 -> up to 256
    assert all(s % 32 == 0 for s in y.shape[-2:])


def test_rescale_constant_image_unchanged_values():
    x = torch.full((1, 3, 64, 64), 0.25)
    assert torch.allclose(rescale_batch(x, 128), torch.full((1, 3, 128, 128), 0.25))


@pytest.mark.slow
def test_multi_scale_sizes_follow_the_seed_and_stay_on_the_stride(tiny_data, tmp_path):
    cb, seen = _batch_recorder()
    train.run(data=str(tiny_data), project=str(tmp_path), epochs=1, noplots=True, noval=True, multi_scale=True,
              callbacks=cb, **TINY)
    expected = [size_for_step(64, 32, TINY["seed"], 0, ni) for ni in range(NB)]
    assert len(set(expected)) > 1, "this seed draws different sizes"
    assert [ni for ni, _ in seen] == list(range(NB))
    assert [max(shape[2:]) for _, shape in seen] == expected
    assert all(h % 32 == 0 and w % 32 == 0 and 32 <= max(h, w) <= 96 for _, (_, _, h, w) in seen)
