"""python -m fairseq_tying.core.params against the analytic counts and a really built model."""

from __future__ import annotations

import pytest

from fairseq_tying.core.params import _Task, count, dummy_dictionary
from tests.helpers import TINY_MODEL, build_model, run_module


def test_counts_match_the_built_model_and_the_formula(joined_bin):
    model, task = build_model(joined_bin, "transformer_twwt", "--output-layer", "l2norm")
    built = sum(p.numel() for p in model.parameters())
    total, embedding = count("transformer_twwt", TINY_MODEL, "three_way",
                             _Task(task.source_dictionary, task.target_dictionary))
    vocab = len(task.target_dictionary)
    assert total == built and embedding == vocab * 16


@pytest.mark.slow  # runs the tool
def test_big_transformer_table_from_the_command_line():
    out = run_module("fairseq_tying.core.params", "--arch", "transformer_twwt_wmt_en_de_big",
                     "--src-vocab", "32000", "--tgt-vocab", "32000")
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines()
            if line.startswith("| ") and "tying" not in line}
    v, d = 32000, 1024
    totals = {k: int(r.split("|")[2].replace(",", "")) for k, r in rows.items()}
    assert totals["none"] - totals["decoder"] == v * d
    assert totals["decoder"] - totals["three_way"] == v * d
    assert "| three_way | 209,125,376 | 32,768,000 |" in out.stdout  # fairseq's 210M big model


def test_different_vocabularies_rule_out_three_way():
    task = _Task(dummy_dictionary(100), dummy_dictionary(120))
    total, embedding = count("dynamicconv_dwt", TINY_MODEL, "decoder", task)
    assert embedding == 100 * 16 + 120 * 16
    assert total > embedding
