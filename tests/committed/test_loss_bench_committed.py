"""The chunked loss's tables in docs/performance.md and the README are what the committed
``bench --mode loss`` reports give (CPU: docs/performance_loss.json; CUDA fp16 on an H100:
docs/performance_loss_cuda.json)."""

from __future__ import annotations

import json

from fairseq_tying.bench import loss
from fairseq_tying.common.atomic import block_text
from tests.helpers import REPO

DOCS = REPO / "docs"
PATHS = [DOCS / f"performance_loss{s}.json" for s in ("", "_cuda")]
REPORTS = [json.loads(p.read_text()) for p in PATHS]


def _block(path, name: str) -> str:
    return block_text(path.read_text(), name).strip()


def test_the_reports_measure_every_model_at_every_vocabulary():
    entries = [e for r in REPORTS for e in loss.setups(r).values()]
    assert [(e["device"], e["dtype"]) for e in entries] == [("cpu", "fp32"), ("cuda", "fp16")]
    for entry in entries:
        assert "4096" in entry["results"] and entry["max_tokens"]["vocab"] == 64000
        by_vocab = entry["results"]["4096"]
        assert {"8000", "32000", "64000", "128000"} <= set(by_vocab)
        for res in by_vocab.values():
            measured = [m for m in loss.MODELS if "loss" in res.get(m, {})]
            assert {"builtin", "chunked_old"} <= set(measured)
            losses = {round(res[m]["loss"] / res["builtin"]["loss"], 3) for m in measured}
            assert losses == {1.0}  # the same loss from the same weights and batch


def test_the_tables_are_the_reports():
    assert _block(DOCS / "performance.md", loss.TABLE_BLOCK) == \
        loss.tables(list(zip(PATHS, REPORTS, strict=True)), DOCS).strip()
    assert _block(REPO / "README.md", loss.SUMMARY_BLOCK) == loss.summary(REPORTS).strip()


def test_a_second_cuda_run_reproduces_every_loss_and_memory_number():
    cuda = REPORTS[1]
    rerun = json.loads((DOCS / "performance_loss_cuda_rerun.json").read_text())
    assert rerun["config"] == cuda["config"] and rerun["max_tokens"] == cuda["max_tokens"]
    for vocab, res in cuda["results"].items():
        for model, measured in res.items():
            again = rerun["results"][vocab][model]
            assert {k: v for k, v in measured.items() if not k.endswith("_s")} == \
                   {k: v for k, v in again.items() if not k.endswith("_s")}
    ratios = [round(r["chunked"]["wall_s"] / r["builtin"]["wall_s"], 1)
              for r in rerun["results"].values()]
    assert ratios == [2.8, 4.0, 4.3, 7.9, 10.9]
    docs = " ".join((DOCS / "performance.md").read_text().split())
    assert "2.8× at 8k, 4.0× at 32k, 4.3× at 64k, 7.9× at 128k and 10.9× at 250k" in docs
