"""A truncated or corrupt checkpoint is named, with the whole checkpoint saved before it, by the
loader every tool shares and by each command: export (fairseq, CTranslate2), evaluation,
analysis and a resumed fairseq-train."""

from __future__ import annotations

import shutil
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from fairseq_tying.core import checkpoint_compat
from fairseq_tying.core.checkpoint_compat import UnreadableCheckpoint
from fairseq_tying.core.models import guards
from tests.helpers import (
    build_tiny_data,
    built_once,
    run_cli,
    run_module,
    train_args,
    train_checkpoint,
)


class _NotAllowed:  # a class the weights_only allowlist does not have
    pass


def _truncate(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    return dest


@pytest.fixture
def folder(tmp_path) -> Path:
    """checkpoint1.pt and checkpoint2.pt whole, checkpoint3.pt cut in half."""
    state = {"model": {"w": torch.randn(4, 3)}, "cfg": {"model": Namespace(tying="none")}}
    for epoch in (1, 2):
        torch.save(state, tmp_path / f"checkpoint{epoch}.pt")
    _truncate(tmp_path / "checkpoint2.pt", tmp_path / "checkpoint3.pt")
    return tmp_path


def test_a_truncated_checkpoint_names_itself_and_the_one_before(folder):
    assert torch.equal(checkpoint_compat.load(folder / "checkpoint2.pt")["model"]["w"],
                       torch.load(folder / "checkpoint2.pt", weights_only=True)["model"]["w"])
    with pytest.raises(UnreadableCheckpoint) as err:
        checkpoint_compat.load(folder / "checkpoint3.pt")
    message = str(err.value)
    assert f"checkpoint {folder / 'checkpoint3.pt'} cannot be read" in message
    assert "truncated or corrupt" in message and "PytorchStreamReader" in message
    assert f"--restore-file {folder / 'checkpoint2.pt'}" in message


def test_checkpoint_last_points_to_the_newest_whole_epoch_checkpoint(folder):
    """checkpoint3.pt is newer but truncated: checkpoint2.pt is the one to use."""
    (folder / "checkpoint_last.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(UnreadableCheckpoint, match="checkpoint2.pt: use that one"):
        checkpoint_compat.load(folder / "checkpoint_last.pt")
    (folder / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(UnreadableCheckpoint, match="checkpoint_best.pt cannot be read"):
        checkpoint_compat.load(folder / "checkpoint_best.pt")
    (folder / "alone").mkdir()
    alone = _truncate(folder / "checkpoint1.pt", folder / "alone" / "checkpoint5.pt")
    with pytest.raises(UnreadableCheckpoint, match="No earlier epoch checkpoint"):
        checkpoint_compat.load(alone)


def test_a_readable_checkpoint_with_a_foreign_class_keeps_torchs_message(tmp_path):
    torch.save({"x": _NotAllowed()}, tmp_path / "foreign.pt")
    with pytest.raises(Exception, match="Unsupported global") as err:
        checkpoint_compat.load(tmp_path / "foreign.pt")
    assert not isinstance(err.value, UnreadableCheckpoint)


def test_the_resume_guard_reads_through_the_same_loader(folder):
    """fairseq-train resuming checkpoint_last.pt: the guard's memory-mapped read names it."""
    _truncate(folder / "checkpoint2.pt", folder / "checkpoint_last.pt")
    with pytest.raises(UnreadableCheckpoint, match="checkpoint_last.pt cannot be read"):
        guards.saved_model_args(folder / "checkpoint_last.pt")


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared data, a run folder): a trained checkpoint1.pt, checkpoint_last.pt cut short."""
    data = built_once(tmp_path_factory, "tinydata", build_tiny_data)
    run = tmp_path_factory.mktemp("broken")
    last = train_checkpoint(data / "bin", run, "transformer_twwt", "three_way", "dot", False,
                            updates=2)
    shutil.copyfile(last, run / "checkpoint1.pt")
    _truncate(run / "checkpoint1.pt", last)
    return data, run


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "export-ct2", "evaluation", "analysis", "train"])
def test_every_command_names_the_unreadable_checkpoint(broken_run, tmp_path, command):
    data, run = broken_run
    last = run / "checkpoint_last.pt"
    proc = {
        "export": lambda: run_module("fairseq_tying.export", last, tmp_path / "out.pt",
                                     check=False),
        "export-ct2": lambda: run_module("fairseq_tying.export", last, tmp_path / "ct2",
                                         "--format", "ctranslate2", check=False),
        "evaluation": lambda: run_module("fairseq_tying.evaluation", "evaluate", run, "--data",
                                         data, "--checkpoint", last, "--cpu", check=False),
        "analysis": lambda: run_module("fairseq_tying.analysis", last, "--out", tmp_path / "a",
                                       check=False),
        "train": lambda: run_cli("fairseq-train", *train_args(data / "bin", run,
                                                              "transformer_twwt", updates=4),
                                 check=False),
    }[command]()
    assert proc.returncode != 0
    assert f"checkpoint {last} cannot be read" in proc.stderr, proc.stderr[-2000:]
    assert f"--restore-file {run / 'checkpoint1.pt'}" in proc.stderr
    assert not (tmp_path / "out.pt").exists() and not (tmp_path / "ct2").exists()
