"""The demo pipeline end to end on a slice of the embedded corpus with a tiny budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairseq_tying import demo
from fairseq_tying.common.blocks import markers
from fairseq_tying.common.reproducible import has_avx2
from fairseq_tying.data import bible
from tests.helpers import run_module


def _slice(src: Path, dst: Path, sizes: dict[str, int]) -> None:
    dst.mkdir()
    for split, n in sizes.items():
        for lang in ("es", "en"):
            lines = (src / f"{split}.{lang}").read_text().splitlines(keepends=True)[:n]
            (dst / f"{split}.{lang}").write_text("".join(lines))


@pytest.mark.slow
def test_demo_pipeline_with_a_tiny_budget(tmp_path):
    bible.extract(tmp_path / "full")
    _slice(tmp_path / "full", tmp_path / "corpus", {"train": 400, "valid": 20, "test": 12})
    out = tmp_path / "demo"
    readme = tmp_path / "README.md"
    readme.write_text("# R\n\n{}\nstale\n{}\n\nrest\n".format(*markers("demo")))
    proc = run_module("fairseq_tying.demo", "--out", out, "--corpus", tmp_path / "corpus",
                      "--vocab-size", "300", "--max-update", "6",
                      "--record", tmp_path / "demo.json", "--readme", readme)
    log = proc.stdout + proc.stderr
    assert "num_updates 6" in log  # fairseq's own training log is shown
    results = out / "results"
    table = (results / "results.md").read_text()
    assert "transformer_twwt:dot" in table and "transformer_twwt:l2norm" in table
    assert "No Δ or p here" in table and "Δ BLEU" not in table  # one seed: scores alone
    for png in ("bleu.png", "norms.png"):
        assert (results / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for output_layer in ("dot", "l2norm"):
        run = out / "runs" / f"corpus.transformer_twwt.three_way.{output_layer}.s1"
        record = json.loads((run / "eval.json").read_text())
        assert record["run"]["output_layer"] == output_layer and record["subset"] == "test"
        hyps = run / record["hypotheses"]
        assert len(hyps.read_text().splitlines()) == 12

    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary == json.loads((results / "demo.json").read_text())
    for row in summary["layers"].values():
        record = json.loads((out / "runs" / row["run"] / "eval.json").read_text())
        assert row["bleu"] == round(record["bleu"], 2) and row["sentences"] == 12
    assert summary["max_update"] == 6 and "--max-update 6" in summary["command"]
    # the processor, with the kernels the pinned training processes ran (AVX2 where it can)
    model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name"))
    cpu = summary["machine"]["cpu"]
    kernels = "AVX2 kernels" if has_avx2() else " kernels"
    assert cpu.startswith(f"{model}, ") and cpu.endswith(kernels)
    assert f"({cpu})" in demo.readme_block(summary)
    text = readme.read_text()
    assert "stale" not in text and text.endswith("\nrest\n")
    assert demo.readme_block(summary) in text


def test_report_only_needs_a_record(tmp_path, capsys):
    with pytest.raises(SystemExit):
        demo.main(["--report-only", "--record", str(tmp_path / "none.json"),
                   "--readme", str(tmp_path / "R.md")])
    assert "--record" in capsys.readouterr().err and not (tmp_path / "R.md").exists()

