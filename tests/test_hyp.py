"""Hyperparameter files (utils/hyp.py): each value is checked in one line, an unknown key is named once with the
nearest known key, and the code reads hyperparameters only through the one table."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from helpers import hyp_file, log_lines as _lines

from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("edit, words", [({"lrf": "abc"}, "lrf must be a number"), ({"anchor_t": None}, "anchor_t"),
                                         ({"scale": 5.0}, "scale must be a number"), ({"mosaic": float("nan")}, "mosaic"),
                                         ({"lr0": True}, "lr0")])
def test_hyp_values_are_checked_in_one_line(tmp_path, edit, words):
    import yaml

    from utils.hyp import load_hyp

    hyp = yaml.safe_load((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text())
    f = tmp_path / "hyp.yaml"
    f.write_text(yaml.safe_dump({**hyp, **edit}))
    with pytest.raises(UserError, match=words) as e:
        load_hyp(f)
    assert "\n" not in str(e.value)
    missing = {k: v for k, v in hyp.items() if k != "lr0"}
    f.write_text(yaml.safe_dump(missing))
    with pytest.raises(UserError, match="missing 'lr0'"):
        load_hyp(f)


@pytest.mark.usefixtures("one_thread")
def test_unknown_hyp_keys_are_named_once_with_the_nearest_known_key(tmp_path, caplog):
    from utils.hyp import load_hyp

    path = hyp_file(tmp_path, lr_0=0.01, bogus_key=1)
    with caplog.at_level(logging.WARNING):
        load_hyp(path)
        load_hyp(path)  # read again (the loader, each generation of a search): no second warning
    warnings = _lines(caplog, "warning: ")
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: hyperparameter file {path}: unknown key(s) "
                                                         f"ignored: 'bogus_key' (nearest known key: ")
    assert "'lr_0' (nearest known key: lr0)" in warnings[0]


@pytest.mark.usefixtures("one_thread")
def test_hyperparameters_are_read_only_through_the_table():
    """utils/hyp.Hyp is the one table (a key the code reads and the table lacks fails as an AttributeError, not as a
    silent default): no module reads a hyp as a mapping with a default of its own, and every key in the table is
    read somewhere (or says it is unused)."""
    from dataclasses import fields

    from utils.hyp import Hyp

    code = {f.relative_to(REPO).as_posix(): f.read_text() for f in REPO.rglob("*.py")
            if not f.relative_to(REPO).as_posix().startswith(("tests/", "bench/", ".", "ci_clone"))}
    mapping_reads = [(name, m.group(0)) for name, text in code.items() if name != "utils/hyp.py"
                     for m in re.finditer(r"hyp(?:\.get\(|\[)", text)]
    assert not mapping_reads, mapping_reads
    every = "\n".join(code.values())
    for f in fields(Hyp):
        assert f.name == "given" or "unused" in f.metadata["meaning"] or re.search(rf"\.{f.name}\b", every), f.name
