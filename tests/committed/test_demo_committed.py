"""The README's demo block is what the committed demo record gives."""

from __future__ import annotations

import json
import re

from fairseq_tying import demo
from fairseq_tying.common.blocks import block_text
from tests.helpers import REPO


def test_the_readme_demo_block_is_the_committed_record():
    """The README's demo numbers are docs/demo/demo.json's, as --report-only writes them."""
    record = json.loads((REPO / "docs" / "demo" / "demo.json").read_text())
    assert set(record["layers"]) == {"dot", "l2norm"} and record["max_update"] == 600
    block = block_text((REPO / "README.md").read_text(), "demo")
    assert block.strip() == demo.readme_block(record).strip()


def test_the_serving_table_is_the_committed_reports():
    """docs/serving.md's serving block is `bench --mode serve --summarize` of the committed
    reports of the demo's checkpoints, whose BLEU is the demo record's."""
    from fairseq_tying.bench import serve

    record = json.loads((REPO / "docs" / "demo" / "demo.json").read_text())
    paths = [REPO / "docs" / "serving" / f"demo-{layer}.json" for layer in record["layers"]]
    reports = [json.loads(p.read_text()) for p in paths]
    for report, row in zip(reports, record["layers"].values(), strict=True):
        assert row["run"] in report["config"]["checkpoint"]
        assert round(report["results"]["fairseq"]["bleu"], 2) == row["bleu"]
    block = block_text((REPO / "docs" / "serving.md").read_text(), "serving")
    assert serve.summary_table(reports) in block


def test_the_serving_example_quotes_its_models_record():
    """docs/serving.md's raw-text example names its model and that model's BLEU: the BLEU is
    the one of the record it links to."""
    text = " ".join((REPO / "docs" / "serving.md").read_text().split())
    found = re.search(r"one-epoch study model `([^`]+)` \(BLEU ([\d.]+) on the Bible test set, "
                      r"\[its record\]\(([^)]+)\)", text)
    assert found, "the example's model, BLEU and record link"
    name, bleu, link = found.groups()
    assert link == f"study/records/{name}.json"
    record = json.loads((REPO / "docs" / link).read_text())
    assert record["checkpoint"] == "checkpoint_last.pt"  # the checkpoint the example exports
    assert bleu == f"{record['eval']['bleu']:.2f}"
