"""The chunked loss's tables in docs/performance.md and the README are what the committed
``bench --mode loss`` reports give (CPU: docs/performance_loss.json; CUDA fp16 on an H100:
docs/performance_loss_cuda.json)."""

from __future__ import annotations

import json

from fairseq_tying.bench import loss, loss_report
from fairseq_tying.common.atomic import block_text
from tests.helpers import REPO

DOCS = REPO / "docs"
PATHS = [DOCS / f"performance_loss{s}.json" for s in ("", "_cuda")]
REPORTS = [json.loads(p.read_text()) for p in PATHS]


def _block(path, name: str) -> str:
    return block_text(path.read_text(), name).strip()


def test_the_reports_measure_every_model_at_every_vocabulary():
    entries = [e for r in REPORTS for e in loss_report.setups(r).values()]
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
    assert _block(DOCS / "performance.md", loss_report.TABLE_BLOCK) == \
        loss_report.tables(list(zip(PATHS, REPORTS, strict=True)), DOCS).strip()
    assert _block(REPO / "README.md", loss_report.SUMMARY_BLOCK) == \
        loss_report.summary(REPORTS).strip()


def test_a_second_cuda_run_reproduces_every_loss_and_memory_number():
    cuda = REPORTS[1]
    rerun = json.loads((DOCS / "performance_loss_cuda_rerun.json").read_text())
    assert rerun["config"] == cuda["config"] and rerun["max_tokens"] == cuda["max_tokens"]
    for vocab, res in cuda["results"].items():
        for model, measured in res.items():
            again = rerun["results"][vocab][model]
            assert {k: v for k, v in measured.items() if not k.endswith("_s")} == \
                   {k: v for k, v in again.items() if not k.endswith("_s")}


def test_the_cpu_report_meets_the_goals_and_names_its_processor():
    """Chunked step time ≤ the built-in's at V = 32k and 64k with 4k tokens and loss memory
    ≤ 1/4 of the built-in's (the goals the default rests on), measured on a named CPU."""
    cpu = REPORTS[0]
    assert cpu["machine"]["cpu"] and "kernels" in cpu["machine"]["cpu"]
    (entry,) = (e for e in loss_report.setups(cpu).values() if e["device"] == "cpu")
    for vocab in ("32000", "64000"):
        res = entry["results"]["4096"][vocab]
        assert res["chunked"]["cpu_s"] <= res["builtin"]["cpu_s"], vocab
        assert res["chunked"]["loss_extra"] <= res["builtin"]["loss_extra"] / 4, vocab
