"""common/atomic.py: a write that fails part-way leaves the old file (or folder) as it was and
no temporary behind."""

from __future__ import annotations

import pytest

from fairseq_tying.common.atomic import atomic_write, building_dir, write_json, write_text


class Interrupted(Exception):
    pass


def half_then_raise(tmp: str) -> None:
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("half of the new ")
        f.flush()
    raise Interrupted


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = write_text(tmp_path / "result.json", "the old result\n")
    with pytest.raises(Interrupted):
        atomic_write(target, half_then_raise)
    assert target.read_text() == "the old result\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_failed_first_write_leaves_nothing(tmp_path):
    with pytest.raises(Interrupted):
        atomic_write(tmp_path / "new.txt", half_then_raise)
    assert list(tmp_path.iterdir()) == []


def test_a_write_replaces_the_file_whole(tmp_path):
    target = write_json(tmp_path / "r.json", {"a": 1})
    write_json(target, {"b": 2})
    assert target.read_text() == '{\n  "b": 2\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_failed_folder_leaves_the_old_one_and_no_temporary(tmp_path):
    dest = tmp_path / "checkpoints"
    with building_dir(dest) as work:
        (work / "old.pt").write_text("old")
    with pytest.raises(Interrupted), building_dir(dest) as work:
        (work / "new.pt").write_text("half")
        raise Interrupted
    assert sorted(p.name for p in dest.iterdir()) == ["old.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
    assert (dest / "old.pt").read_text() == "old"
