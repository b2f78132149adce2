"""The chunked loss's tables in docs/performance.md and the README are what the committed
``bench --mode loss`` reports give (CPU: docs/performance_loss.json; CUDA fp16 and bf16 on an H200:
docs/performance_loss_h200_fp16.json, docs/performance_loss_h200_bf16.json)."""

from __future__ import annotations

import json

from fairseq_tying.bench import loss, loss_report
from fairseq_tying.common.blocks import block_text
from fairseq_tying.core.criterions.chunked import CHUNKED_BY_DEFAULT
from tests.helpers import REPO

DOCS = REPO / "docs"
PATHS = [DOCS / f"performance_loss{s}.json" for s in ("", "_h200_fp16", "_h200_bf16")]
REPORTS = [json.loads(p.read_text()) for p in PATHS]


def _block(path, name: str) -> str:
    return block_text(path.read_text(), name).strip()


def test_the_reports_measure_every_model_at_every_vocabulary():
    """The CPU measures all three losses; the H200's torch has no F.linear_cross_entropy, so
    torch's op is skipped there, by name. Every measured loss is the built-in's (same weights
    and batch), and the chunked loss's extra memory is below the built-in's from V = 32k."""
    entries = [e for r in REPORTS for e in loss_report.setups(r).values()]
    assert [(e["device"], e["dtype"]) for e in entries] == [
        ("cpu", "fp32"), ("cuda", "fp16"), ("cuda", "bf16")]
    for entry in entries:
        by_vocab = entry["results"]["4096"]
        assert {"8000", "64000"} <= set(by_vocab)
        for vocab, res in by_vocab.items():
            measured = [m for m in loss.MODELS if "loss" in res.get(m, {})]
            expected = {"builtin", "chunked"} | ({"chunked_old"} if entry["device"] == "cpu"
                                                 else set())
            assert set(measured) == expected
            if entry["device"] == "cuda":
                assert "no F.linear_cross_entropy" in res["chunked_old"]["skipped"]
            losses = {round(res[m]["loss"] / res["builtin"]["loss"], 3) for m in measured}
            assert losses == {1.0}  # the same loss from the same weights and batch
            if int(vocab) >= 32000:
                assert res["chunked"]["loss_extra"] < res["builtin"]["loss_extra"] / 4


def test_the_tables_are_the_reports():
    assert _block(DOCS / "performance.md", loss_report.TABLE_BLOCK) == \
        loss_report.tables(list(zip(PATHS, REPORTS, strict=True)), DOCS).strip()
    assert _block(REPO / "README.md", loss_report.SUMMARY_BLOCK) == \
        loss_report.summary(REPORTS).strip()


def test_the_cuda_default_is_what_the_h200_reports_show():
    """--chunked-loss is off by default on CUDA because every H200 step took longer than the
    built-in's, in fp16 and bf16."""
    assert CHUNKED_BY_DEFAULT["cuda"] is None
    for report in REPORTS[1:]:
        for entry in loss_report.setups(report).values():
            for by_vocab in entry["results"].values():
                for res in by_vocab.values():
                    assert res["chunked"]["wall_s"] > res["builtin"]["wall_s"]


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


def _prose(path) -> str:
    """The page's text, every run of whitespace one space (the prose wraps anywhere)."""
    return " ".join(path.read_text().split())


def test_the_prose_quotes_the_h200_reports():
    """The range of "chunked ÷ built-in time" the prose gives per precision, and of "chunked ÷
    built-in memory", are the H200 reports' (every batch and V of each)."""
    text = _prose(DOCS / "performance.md")
    memory = []
    for report in REPORTS[1:]:
        (entry,) = loss_report.setups(report).values()
        results = [r for by_vocab in entry["results"].values() for r in by_vocab.values()]
        times = [r["chunked"]["wall_s"] / r["builtin"]["wall_s"] for r in results]
        memory += [r["chunked"]["loss_extra"] / r["builtin"]["loss_extra"] for r in results]
        quoted = f"{min(times):.2f}–{max(times):.2f}× the built-in's wall time in fp16" \
            if entry["dtype"] == "fp16" else f"{min(times):.2f}–{max(times):.2f}× in bf16"
        assert quoted in text, entry["dtype"]
    assert f"{min(memory):.2f}–{max(memory):.2f} of the built-in's loss memory on the H200" in text


def test_the_rows_per_chunk_quoted_are_the_rule():
    """performance.md's rows per chunk at the default budget and V = 32,000 are what
    rows_per_chunk gives, for fp32 and for a half model."""
    import torch

    from fairseq_tying.core.criterions.chunked import DEFAULT_MB, rows_per_chunk

    fp32, half = (rows_per_chunk(32000, dtype, DEFAULT_MB) for dtype in (torch.float32,
                                                                        torch.float16))
    assert (fp32, half) == (524, 349)
    text = _prose(DOCS / "performance.md")
    assert f"{fp32} rows at V = 32,000; 6 bytes a score for a half model, {half} rows" in text


PEERS_PATH = DOCS / "performance_loss_peers.json"


def test_the_peers_table_is_its_report_and_the_prose_quotes_it():
    """The loss_peers block is what docs/performance_loss_peers.json gives; every peer measured
    at every V computed the same loss (ε = 0, the same inputs); the prose's times and memory of
    the chunked loss and CCE at V = 64k are the report's."""
    report = json.loads(PEERS_PATH.read_text())
    assert _block(DOCS / "performance.md", loss_report.PEER_BLOCK) == \
        loss_report.peer_tables([(PEERS_PATH, report)], DOCS).strip()
    assert report["config"]["threads"] == 1 and "kernels" in report["machine"]["cpu"]
    by_vocab = report["peers"]["results"]["4096"]
    assert {"8000", "64000"} <= set(by_vocab)
    for res in by_vocab.values():
        assert set(res) == set(loss_report.PEERS)
        assert {round(r["loss"] / res["cross_entropy"]["loss"], 4) for r in res.values()} == {1.0}
    res, text = by_vocab["64000"], _prose(DOCS / "performance.md")
    for name in ("chunked", "cce"):
        quoted = (f"{res[name]['cpu_s']:.2f} s and {res[name]['loss_extra'] / 2**20:,.0f} MiB")
        assert quoted in text, name
