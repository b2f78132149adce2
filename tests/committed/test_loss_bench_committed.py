"""The chunked loss's tables in docs/performance.md and the README are what the committed
``bench --mode loss`` reports give (CPU: docs/performance_loss.json; CUDA fp16 on an H100:
docs/performance_loss_cuda.json)."""

from __future__ import annotations

import json

from fairseq_tying.bench import loss
from tests.helpers import REPO

CPU, CUDA = (json.loads((REPO / "docs" / f"performance_loss{s}.json").read_text())
             for s in ("", "_cuda"))


def test_the_reports_measure_every_model_at_every_vocabulary():
    for report, device in ((CPU, "cpu"), (CUDA, "cuda")):
        assert report["config"]["device"] == device and report["config"]["tokens"] == 4096
        assert {"8000", "32000", "64000", "128000"} <= set(report["results"])
        assert report["max_tokens"]["vocab"] == 64000
        for res in report["results"].values():
            measured = [m for m in loss.MODELS if "loss" in res[m]]
            losses = {round(res[m]["loss"] / res["builtin"]["loss"], 3) for m in measured}
            assert losses == {1.0}  # the same loss from the same weights and batch


def test_the_tables_are_the_reports():
    docs = (REPO / "docs" / "performance.md").read_text()
    assert loss.table(CPU) in docs and loss.table(CUDA) in docs
    assert loss.summary(CPU, CUDA) in (REPO / "README.md").read_text()


def test_a_second_cuda_run_reproduces_every_loss_and_memory_number():
    rerun = json.loads((REPO / "docs" / "performance_loss_cuda_rerun.json").read_text())
    assert rerun["config"] == CUDA["config"] and rerun["max_tokens"] == CUDA["max_tokens"]
    for vocab, res in CUDA["results"].items():
        for model, measured in res.items():
            again = rerun["results"][vocab][model]
            assert {k: v for k, v in measured.items() if not k.endswith("_s")} == \
                   {k: v for k, v in again.items() if not k.endswith("_s")}
    ratios = [round(r["chunked"]["wall_s"] / r["builtin"]["wall_s"], 1)
              for r in rerun["results"].values()]
    assert ratios == [2.8, 4.0, 4.3, 7.9, 10.9]
    docs = " ".join((REPO / "docs" / "performance.md").read_text().split())
    assert "2.8× at 8k, 4.0× at 32k, 4.3× at 64k, 7.9× at 128k and 10.9× at 250k" in docs
