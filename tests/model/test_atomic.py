"""gem_model.store.atomic: a target is the old content or the new one, never half; no temporary left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gem_model.store import atomic


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "ACCEPTED"
    atomic.write_text(target, "v1\n")
    atomic.write_json(tmp_path / "m.json", {"ne": float("nan")}, allow_nan=True)
    assert target.read_text() == "v1\n"
    assert json.loads((tmp_path / "m.json").read_text().replace("NaN", "null")) == {"ne": None}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["ACCEPTED", "m.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    atomic.write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_temporary_names_are_unique_and_keep_the_suffix(tmp_path: Path) -> None:
    with atomic.atomic_path(tmp_path / "s.pt2") as a, atomic.atomic_path(tmp_path / "s.pt2") as b:
        assert a != b and a.suffix == b.suffix == ".pt2"
        a.write_bytes(b"a")
        b.write_bytes(b"b")
    assert (tmp_path / "s.pt2").read_bytes() == b"a"  # the last to finish wins, whole
