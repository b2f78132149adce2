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
