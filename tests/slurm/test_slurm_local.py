"""``--local``: the same jobs without SLURM (submitit's local executor), no root needed."""

from __future__ import annotations

import json

import pytest
from conftest import launch, write_sweep

pytestmark = pytest.mark.slow


def test_local_two_workers(tiny_data, tmp_path):
    sweep = write_sweep(tmp_path / "local.yaml", grid={"output_layer": ["l2norm"], "seed": [3]},
                        resources={"tasks_per_node": 2}, evaluation={"enabled": False})
    out = tmp_path / "runs"
    launch(str(sweep), "--local", "--output-dir", str(out), data=tiny_data)
    (run,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    ranks = [json.loads((run / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
    assert json.loads((run / "train.done").read_text())["num_updates"] == 12
    argv = json.loads((run / "command.json").read_text())["argv"]
    assert argv[argv.index("--distributed-world-size") + 1] == "2"
    assert argv[argv.index("--distributed-backend") + 1] == "gloo"
    assert argv[argv.index("--update-freq") + 1] == "1"  # target_gpus 2 on 2 workers
