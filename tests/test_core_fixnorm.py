"""``--output-layer fixnorm``: s_i = g·cos(h, w_i) with one learned g, against independent
formulas and gradients, in every family and tying mode, through resuming and the exports."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from fairseq_tying.core import output_layers
from fairseq_tying.export import ExportError, stock_arch
from tests.helpers import (
    arch_name,
    build_model,
    export_args,
    generate,
    last_updates,
    run_cli,
    run_module,
    train_args,
    train_checkpoint,
)

FAMILIES = ["transformer", "dynamicconv"]
TYINGS = ["none", "decoder", "three_way"]


def _model(data, family: str, tying: str, *flags: str):
    return build_model(data, arch_name(family, tying), "--tying", tying, "--output-layer",
                       "fixnorm", *flags)


def test_scores_and_gradients_match_the_closed_form():
    """s = g·cos(h, w); ∂s/∂g = s/g; autograd's numerical check on h, W and g in float64."""
    torch.manual_seed(0)
    h = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    g = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    s = output_layers.scores("fixnorm", h, w, gain=g)
    torch.testing.assert_close(s, g * F.cosine_similarity(h[:, None], w[None], dim=-1))
    weights = torch.randn_like(s)
    (s * weights).sum().backward()
    torch.testing.assert_close(g.grad, (weights * s / g).sum())
    assert torch.autograd.gradcheck(lambda a, b, c: output_layers.scores("fixnorm", a, b, gain=c),
                                    (h, w, g))


def test_the_gain_is_required_and_a_zero_hidden_state_scores_zero():
    with pytest.raises(ValueError, match="fixnorm.*gain"):
        output_layers.scores("fixnorm", torch.randn(2, 4), torch.randn(5, 4))
    h = torch.zeros(2, 4, requires_grad=True)
    s = output_layers.scores("fixnorm", h, torch.randn(5, 4), gain=torch.tensor(2.0))
    assert not s.any()
    s.sum().backward()
    assert torch.isfinite(h.grad).all() and not h.grad.any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_norms_are_taken_in_fp32(dtype):
    """‖h‖² of these states (≈ 1e7) overflows fp16: the scores stay finite and within each
    format's rounding of g·cos."""
    h, w = torch.randn(4, 64) * 400, torch.randn(30, 64) * 200
    s = output_layers.scores("fixnorm", h.to(dtype), w.to(dtype),
                             gain=torch.tensor(11.3, dtype=dtype))
    want = 11.3 * F.cosine_similarity(h[:, None], w[None], dim=-1)
    assert s.dtype == dtype and torch.isfinite(s).all()
    torch.testing.assert_close(s.float(), want, rtol=0, atol=0.1)


@pytest.mark.parametrize("tying", TYINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_tying_scores_gain_times_cosine(joined_bin, family, tying):
    torch.manual_seed(0)
    model, _ = _model(joined_bin, family, tying)
    scorer = model.decoder.scorer
    dim = scorer.weight.shape[1]
    assert isinstance(scorer.gain, torch.nn.Parameter) and scorer.gain.item() == dim**0.5
    assert any(p is scorer.gain for p in model.parameters())  # the optimizer trains it
    # tied: w_i/‖w_i‖ in every role the matrix takes; untied: the input matrices stay raw
    assert model.decoder.embed_tokens.normalize_rows == (tying != "none")
    pad = model.decoder.embed_tokens.padding_idx
    with torch.no_grad():
        scorer.gain.fill_(4.0)
        scorer.weight[pad].normal_()  # no zero row here
    h = torch.randn(3, dim)
    want = 4.0 * F.cosine_similarity(h[:, None], scorer.weight[None], dim=-1)
    torch.testing.assert_close(model.decoder.output_layer(h), want, rtol=1e-5, atol=1e-5)
    model.eval()
    with torch.no_grad():  # the cached inference path
        torch.testing.assert_close(model.decoder.output_layer(h), want, rtol=1e-5, atol=1e-5)


def test_input_lookups_and_scores_share_one_cached_matrix(joined_bin):
    model, _ = _model(joined_bin, "transformer", "three_way")
    model.eval()
    with torch.no_grad():
        model.decoder.embed_tokens(torch.tensor([[4, 5]]))
        unit = model.decoder.scorer.output_matrix_and_bias()[0]
        again = model.decoder.scorer.output_matrix_and_bias()[0]
    assert unit is again
    torch.testing.assert_close(unit.norm(dim=-1)[4:], torch.ones(len(unit) - 4))


def test_a_dot_checkpoint_loads_into_fixnorm_with_a_fresh_gain(joined_bin):
    """--finetune-from-model with another --output-layer: the checkpoint has no g, which keeps
    its initial √D (a strict load would fail on the missing key); back to dot, g is dropped."""
    dot, _ = build_model(joined_bin, "transformer_twwt", "--output-layer", "dot")
    model, _ = _model(joined_bin, "transformer", "three_way")
    model.load_state_dict(dot.state_dict())
    assert model.decoder.scorer.gain.item() == 16**0.5
    assert torch.equal(model.decoder.scorer.weight, dot.decoder.scorer.weight)
    dot.load_state_dict(model.state_dict())


def test_export_refuses_fixnorm_by_name():
    for allow_bias, target in ((False, "fairseq's transformer"), (True, "CTranslate2's")):
        with pytest.raises(ExportError) as err:
            stock_arch(export_args(output_layer="fixnorm"), allow_bias=allow_bias)
        assert "--output-layer fixnorm" in str(err.value) and target in str(err.value)
        assert "--user-dir fairseq_tying" in str(err.value)


@pytest.mark.slow
def test_training_resumes_exactly_and_exports_are_refused(joined_bin, tmp_path):
    """fairseq-train resumed at update 2 ends where the uninterrupted run is at update 3, g
    included; the fairseq and CTranslate2 exports write nothing."""
    flags = ("--output-layer", "fixnorm")
    straight = tmp_path / "straight"
    proc = run_cli("fairseq-train", *train_args(joined_bin, straight, "transformer_twwt", *flags,
                                                "--save-interval-updates", "1", updates=3))
    assert re.search(r"\| gain [34]\.\d+ \|", proc.stdout + proc.stderr)  # g ≈ √16, logged
    resumed = tmp_path / "resumed"
    proc = run_cli("fairseq-train", *train_args(joined_bin, resumed, "transformer_twwt", *flags,
                                                updates=3),
                   "--restore-file", str(straight / "checkpoint_1_2.pt"))
    assert last_updates(proc.stdout + proc.stderr) == 3
    want = torch.load(straight / "checkpoint_1_3.pt", weights_only=True)["model"]
    got = torch.load(resumed / "checkpoint_last.pt", weights_only=True)["model"]
    assert want["decoder.scorer.gain"].item() != 16**0.5  # g trained
    for key in ("decoder.scorer.gain", "decoder.scorer.weight"):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)
    for fmt in ("fairseq", "ctranslate2"):
        out = tmp_path / fmt / "model"
        proc = run_module("fairseq_tying.export", resumed / "checkpoint_last.pt", out,
                          "--format", fmt, check=False)
        assert proc.returncode == 2 and "--output-layer fixnorm" in proc.stderr, proc.stderr
        assert not (tmp_path / fmt).exists()


@pytest.mark.slow
def test_dynamicconv_generates_with_fixnorm(joined_bin, tmp_path):
    ckpt = train_checkpoint(joined_bin, tmp_path, "dynamicconv_twwt", "three_way", "fixnorm",
                            False, updates=6)
    assert len(generate(joined_bin, ckpt, "--beam", "3")) == 20
