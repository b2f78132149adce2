"""The README's demo block is what the committed demo record gives."""

from __future__ import annotations

import json

from fairseq_tying import demo
from fairseq_tying.common.atomic import markers
from tests.helpers import REPO


def test_the_readme_demo_block_is_the_committed_record():
    """The README's demo numbers are docs/demo/demo.json's, as --report-only writes them."""
    record = json.loads((REPO / "docs" / "demo" / "demo.json").read_text())
    assert set(record["layers"]) == {"dot", "l2norm"} and record["max_update"] == 600
    begin, end = markers("demo")
    block = (REPO / "README.md").read_text().split(begin)[1].split(end)[0]
    assert block.strip() == demo.readme_block(record).strip()
