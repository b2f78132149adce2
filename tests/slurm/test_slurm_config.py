"""Sweep validation and the dry run: no cluster needed, nothing is ever submitted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import REPO, launch, write_sweep

from fairseq_tying.launch.__main__ import main
from fairseq_tying.launch.config import SweepError, load_sweep


@pytest.mark.parametrize(("changes", "key"), [
    ({"resource": {"nodes": 1}}, "resource: unknown key"),
    ({"resources": {"gpu": 1}}, "resources.gpu: unknown key"),
    ({"grid": {"arch": ["transformer_twwt", "transformer_nosuch"]}}, "grid.arch"),
    ({"grid": {"output_layer": ["dot", "softmax2"]}}, "grid.output_layer"),
    ({"datasets": {"tiny": "/nonexistent/data"}}, "datasets.tiny"),
    ({"resources": {"nodes": 0}}, "resources.nodes"),
    ({"resources": {"mem_gb": -1}}, "resources.mem_gb"),
    ({"resources": {"time": "forever"}}, "resources.time"),
    ({"resources": {"gpus_per_node": 4, "tasks_per_node": 2}}, "resources.tasks_per_node"),
    ({"resources": {"nodes": 2}, "batch": {"target_gpus": 3}}, "batch.target_gpus"),
    ({"batch": {"fp16": True}}, "batch.fp16"),
    ({"fairseq": {"update_freq": 4}}, "fairseq.update_freq"),
    ({"grid": {"flags": {"tied_projection": True}}}, "grid.flags: runs with their own flags"),
    ({"grid": {"flags": {"seed": 3}, "tag": "x"}}, "grid.flags.seed"),
    ({"grid": {"flags": {"lr": 0.1}, "tag": "x"}}, "grid.flags.lr: also set in the fairseq"),
    ({"grid": {"flags": {"max_epoch": 3}, "tag": "x"}}, "grid.flags.max_epoch"),
    ({"grid": {"flags": [1], "tag": "x"}}, "grid.flags: expected a mapping"),
    ({"grid": {"tag": "tied L"}}, "grid.tag"),
])
def test_bad_sweep_names_the_key(tmp_path, tiny_data, monkeypatch, capsys, changes, key):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    sweep = write_sweep(tmp_path / "bad.yaml", output_dir=str(tmp_path / "out"), **changes)
    with pytest.raises(SweepError, match=key.replace(".", r"\.")):
        load_sweep(sweep)
    assert main([str(sweep)]) == 2  # the CLI reports it and exits before submitting
    err = capsys.readouterr().err
    assert key in err and "error:" in err
    assert not (tmp_path / "out").exists()


def test_grid_expansion_and_update_freq(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", resources={"nodes": 2},
                                   batch={"target_gpus": 8}), output_dir=tmp_path / "runs")
    names = [r.name for r in sweep.runs]
    assert len(names) == len(set(names)) == 4  # 2 output layers x 2 seeds, all distinct
    assert all(r.run_dir.parent == tmp_path / "runs" for r in sweep.runs)
    args = sweep.runs[0].train_args
    assert args[args.index("--update-freq") + 1] == "4"  # 8 simulated workers on 2
    assert "--cpu" in args and "--fp16" not in args


def test_dry_run_of_the_fp16_gpu_sweep():
    """The GPU path (no GPU here): sbatch parameters and fairseq commands, nothing submitted."""
    proc = launch("slurm/iwslt_transformer.yaml", "--dry-run", "--only", "*dot.s1")
    out = proc.stdout
    assert "#SBATCH --gpus-per-node=4" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --ntasks-per-node=4" in out
    assert "#SBATCH --signal=USR2@" in out and "#SBATCH --time=" in out
    cmd = next(line for line in out.splitlines() if line.startswith("fairseq-train"))
    argv = shlex.split(cmd)
    assert "--fp16" in argv and "--cpu" not in argv
    # 128 simulated GPUs on 2 nodes x 4 GPUs
    assert argv[argv.index("--update-freq") + 1] == "16"
    assert argv[argv.index("--output-layer") + 1] == "dot"
    assert "aftercorr" in out  # evaluation waits for its training task
    assert not Path(REPO, "runs", "iwslt_transformer").exists()


@pytest.mark.slow
def test_only_filters_runs_and_rejects_no_match(tmp_path, tiny_data):
    sweep = write_sweep(tmp_path / "s.yaml", output_dir=str(tmp_path / "out"))
    proc = launch(str(sweep), "--dry-run", "--only", "*l2norm.s2", data=tiny_data)
    assert proc.stdout.count("\nfairseq-train ") == 1 and "l2norm.s2" in proc.stdout
    proc = launch(str(sweep), "--dry-run", "--only", "*nothing*", data=tiny_data, check=False)
    assert proc.returncode == 2 and "--only" in proc.stderr
