"""A new output layer is one class and its test: ``tests/toy_layer.py``'s scaled dot product
s_i = α·h·w_i, registered from outside the package, is a choice of the models (built by
fairseq's parser), trained by fairseq-train with fairseq's loss and the chunked one alike,
decoded, refused by the exports with its own reason, and listed by the benchmark, gpu-check,
the sweep validator and a study's grid."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from fairseq_tying.bench import gpu_check, layers_report
from fairseq_tying.core import output_layers
from fairseq_tying.core.output_layers import BASELINE, OutputLayer, register_output_layer
from fairseq_tying.export import ExportError, stock_arch
from fairseq_tying.studies.records import records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.views.report import Renderer, references
from fairseq_tying.sweeps.config import load_sweep
from tests.helpers import (
    REPO,
    TOY_LAYER,
    assert_same_logs,
    build_model,
    decode,
    export_args,
    run_cli,
    run_module,
    toy_env,
    toy_layer_registered,
    train_both,
    train_checkpoint,
    translation_args,
    write_sweep,
)

REFUSAL = r"--output-layer scaled_dot is a test layer \(α·h·w_i\) that no export writes into"


@pytest.fixture
def toy():
    with toy_layer_registered() as layer:
        yield layer


def _alpha(layer: OutputLayer) -> float:
    return sys.modules[type(layer).__module__].ALPHA


def test_it_scores_alpha_times_the_dot_product_in_a_model_built_by_fairseq(toy, joined_bin):
    torch.manual_seed(0)
    alpha = _alpha(toy)
    h, w = torch.randn(3, 8), torch.randn(20, 8, requires_grad=True)
    output_layers.scores(TOY_LAYER, h, w).sum().backward()
    torch.testing.assert_close(w.grad, alpha * h.sum(0).expand_as(w))
    model, _ = build_model(joined_bin, "transformer_twwt", "--output-layer", TOY_LAYER)
    scorer = model.decoder.scorer
    assert scorer.layer is toy and not model.decoder.embed_tokens.normalize_rows
    h = torch.randn(2, 16)
    want = alpha * h @ scorer.weight.T
    torch.testing.assert_close(model.decoder.output_layer(h), want)
    model.eval()
    with torch.no_grad():  # decoding's cached α·W
        torch.testing.assert_close(model.decoder.output_layer(h), want)
        w_out, _ = scorer.output_matrix_and_bias()
        assert w_out is scorer.output_matrix_and_bias()[0]


def test_a_name_is_registered_once_and_only_for_a_layer(toy):
    with pytest.raises(ValueError, match="cannot register output layer 'scaled_dot' twice"):
        register_output_layer(TOY_LAYER)(type(toy))
    with pytest.raises(ValueError, match="must extend OutputLayer"):
        register_output_layer("not_a_layer")(object)
    assert "not_a_layer" not in output_layers.OUTPUT_LAYERS


def test_the_exports_refuse_it_with_its_own_reason(toy):
    with pytest.raises(ExportError, match=REFUSAL + " fairseq's transformer decoder"):
        stock_arch(export_args(output_layer=TOY_LAYER))
    with pytest.raises(ExportError, match=REFUSAL + " CTranslate2's decoder"):
        stock_arch(export_args(output_layer=TOY_LAYER), formats=("transformer",),
                   allow_bias=True)


def test_the_benchmark_gpu_check_and_sweep_validator_take_it(toy, tmp_path, monkeypatch):
    assert layers_report.model_names()[-1] == TOY_LAYER
    assert gpu_check.parse_args([]).output_layers[-1] == TOY_LAYER
    assert gpu_check.parse_args(["--output-layer", TOY_LAYER]).output_layers == [TOY_LAYER]
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tmp_path / "data"))
    sweep = write_sweep(tmp_path / "s.yaml", grid={"output_layer": [BASELINE, TOY_LAYER]})
    runs = load_sweep(sweep, check_data=False).runs
    assert sorted({r.identity.output_layer for r in runs}) == sorted([BASELINE, TOY_LAYER])


def test_without_it_registered_nothing_knows_it(tmp_path, monkeypatch):
    assert TOY_LAYER not in output_layers.OUTPUT_LAYERS
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tmp_path / "data"))
    sweep = write_sweep(tmp_path / "s.yaml", grid={"output_layer": [TOY_LAYER]})
    with pytest.raises(ValueError, match="grid.output_layer: unknown value 'scaled_dot'"):
        load_sweep(sweep, check_data=False)
    proc = run_cli("fairseq-train", "unused", "--user-dir", "fairseq_tying", "--arch",
                   "transformer_twwt", "--output-layer", TOY_LAYER, "--save-dir", str(tmp_path),
                   check=False)
    assert proc.returncode == 2 and "invalid choice: 'scaled_dot'" in proc.stderr


def _as_toy(record: Record) -> Record:
    """A converged ``cosine`` record relabelled as the toy layer (same hypotheses)."""
    run = replace(record.run, output_layer=TOY_LAYER,
                  name=record.name.replace(".cosine.", f".{TOY_LAYER}."))
    return replace(record, run=run, stats_cache={})


def test_a_study_grid_has_its_row_and_claim(toy):
    """The converged study's three-way ``dot``, ``l2norm`` and ``cosine`` records, ``cosine``
    relabelled: the toy's row in every grid of the translation view, its Δ against ``dot``, and
    its claim with its citation; the papers' table keeps the layers with a paper's Δ."""
    recs = [r for r in records.load(REPO / "docs" / "converged" / "records")
            if r.run.tying == "three_way" and r.run.output_layer in (BASELINE, "l2norm",
                                                                      "cosine")]
    recs = [_as_toy(r) if r.run.output_layer == "cosine" else r for r in recs]
    text, summary = Renderer(recs, references(None), n_samples=50).block("translation")
    assert summary[f"three_way/{TOY_LAYER}"].test("vs_dot").n_seeds == 3
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    rows = [c for c in cells if c[0] == TOY_LAYER]
    # every grid of a three-way-only study (no untied runs: no tying Δ), every one filled
    assert len(rows) == 7 and all(row[1] != "–" for row in rows)
    assert [f"`{TOY_LAYER}` beats `dot` (three-way tying)", "tests/toy_layer.py"] in \
        [c[:2] for c in cells]
    paper = text.split("**Our Δ beside the paper's Δ**")[1].split("\n\n")[1]
    assert TOY_LAYER not in paper and "| l2norm " in paper and "cosine" not in paper


@pytest.mark.slow
def test_fairseq_trains_it_with_either_loss_decodes_it_and_the_exports_refuse_it(joined_bin,
                                                                                tmp_path):
    env = toy_env()
    want, got = train_both(*translation_args(joined_bin, tmp_path, "transformer_twwt",
                                             "--output-layer", TOY_LAYER), env=env)
    assert_same_logs(want, got)
    ckpt = train_checkpoint(joined_bin, tmp_path / "run", "transformer_twwt", "three_way",
                            TOY_LAYER, False, env=env)
    decoded = decode(joined_bin, ckpt, "--user-dir", "fairseq_tying", env=env)
    assert len(decoded.hypotheses) >= 16 and all(map(str.strip, decoded.hypotheses.values()))
    for fmt, target in (("fairseq", "fairseq's transformer"), ("ctranslate2", "CTranslate2's")):
        proc = run_module("fairseq_tying.export", ckpt, tmp_path / fmt, "--format", fmt,
                          check=False, env=env)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{REFUSAL.replace(chr(92), '')} {target} decoder" in proc.stderr
        assert not (tmp_path / fmt).exists()
