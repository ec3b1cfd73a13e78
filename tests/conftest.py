"""Shared test fixtures: repository paths and the optional COCO128 copy beside the checkout."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COCO128 = REPO.parent / "shared" / "datasets" / "coco128"


@pytest.fixture
def coco128_dir() -> Path:
    if not (COCO128 / "coco128.yaml").is_file():
        pytest.skip(f"COCO128 not found at {COCO128}")
    return COCO128
