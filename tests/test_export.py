"""Export to a stock fairseq transformer: stock fairseq-generate (no --user-dir) loads the
exported checkpoint and finds the same hypotheses as the plugin on the original."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from fairseq_tying import export
from tests.helpers import (
    arch_name,
    build_model,
    decode,
    export_args,
    run_module,
    train_checkpoint,
)

CASES = [  # (--tying, --output-layer, --tied-projection) of the arch whose default is that tying
    *[("three_way", output_layer, proj)
      for output_layer in ("dot", "l2norm", "cosine", "sqnorm") for proj in (False, True)],
    ("decoder", "l2norm", False),
    ("none", "l2norm", False),
]


def _export(ckpt: Path, out: Path) -> subprocess.CompletedProcess:
    return run_module("fairseq_tying.export", ckpt, out, check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("tying", "output_layer", "projection"), CASES)
def test_stock_fairseq_generate_reproduces_the_plugin(
    joined_bin, trained, tmp_path, tying, output_layer, projection
):
    run = trained(arch_name("transformer", tying), tying, output_layer, projection)
    out = tmp_path / "stock" / "model.pt"
    proc = _export(run.ckpt, out)
    assert proc.returncode == 0, proc.stderr[-3000:]

    state = torch.load(out, weights_only=True)  # plain values only, whatever is allowlisted
    model_cfg = state["cfg"]["model"]
    assert isinstance(model_cfg, dict) and model_cfg["arch"] == model_cfg["_name"] == "transformer"
    assert model_cfg["user_dir"] is None and state["cfg"]["common"]["user_dir"] is None
    assert "output_layer" not in model_cfg and "last_optimizer_state" not in state
    assert state["cfg"]["criterion"]["_name"] == "label_smoothed_cross_entropy"
    tied = not projection and output_layer in ("dot", "l2norm") and tying != "none"
    assert model_cfg["share_decoder_input_output_embed"] is tied
    assert model_cfg["share_all_embeddings"] is (tied and tying == "three_way")
    assert not any(k.startswith("decoder.scorer") for k in state["model"])
    if output_layer == "l2norm":  # unit rows baked into the tied lookup, or the output matrix
        matrix = "output_projection" if tying == "none" else "embed_tokens"
        norms = state["model"][f"decoder.{matrix}.weight"][4:].norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms))

    ours = run.decoded  # fairseq-generate with --user-dir fairseq_tying
    stock = decode(joined_bin, out)  # no --user-dir: fairseq never imports the plugin
    assert len(set(ours.hypotheses.values())) > 3  # a model that says something
    assert stock.hypotheses == ours.hypotheses
    for i, score in ours.scores.items():
        assert abs(stock.scores[i] - score) < 1e-3


@pytest.mark.slow
def test_distance_is_refused_and_nothing_is_written(joined_bin, tmp_path):
    ckpt = train_checkpoint(
        joined_bin, tmp_path / "ckpt", "transformer_twwt", "three_way", "distance", False, updates=2
    )
    out = tmp_path / "stock" / "model.pt"
    proc = _export(ckpt, out)
    assert proc.returncode == 2
    assert "--output-layer distance" in proc.stderr and "bias" in proc.stderr
    assert not out.exists() and not (tmp_path / "stock").exists()


def test_missing_checkpoint_is_named(tmp_path):
    proc = _export(tmp_path / "nope.pt", tmp_path / "out.pt")
    assert proc.returncode == 2 and "nope.pt does not exist" in proc.stderr
    assert not (tmp_path / "out.pt").exists()


def test_inexpressible_models_are_refused_with_the_flag_at_fault():
    import fairseq_tying  # noqa: F401  (registers the archs)

    with pytest.raises(export.ExportError, match="--tied-embed-dim 8"):
        export._check(export_args(tied_embed_dim=8))
    with pytest.raises(export.ExportError, match="--arch transformer is not"):
        export._check(export_args(arch="transformer"))  # fairseq's own: nothing to bake
    export._check(export_args(tied_embed_dim=16))  # equal to the decoder size: fine


def test_projection_is_folded_into_the_output_matrix():
    import fairseq_tying  # noqa: F401

    g = torch.Generator().manual_seed(0)
    w, proj = torch.randn(10, 4, generator=g), torch.randn(4, 6, generator=g)
    state = {
        "encoder.embed_tokens.weight": w,
        "decoder.embed_tokens.weight": w,
        "decoder.scorer.weight": w,
        "decoder.scorer.projection.weight": proj,
    }
    new, flags = export.bake(state, export_args(output_layer="sqnorm"))
    h = torch.randn(3, 6, generator=g)
    want = (h @ proj.T) @ (w / w.norm(dim=-1, keepdim=True).square()).T
    torch.testing.assert_close(h @ new["decoder.output_projection.weight"].T, want)
    assert new["decoder.output_projection.weight"].shape == (10, 6)
    assert flags == {"share_all_embeddings": False, "share_decoder_input_output_embed": False}
    torch.testing.assert_close(new["encoder.embed_tokens.weight"], w)  # cosine/sqnorm: raw rows


def _plugin_model(joined_bin: Path, tying: str, output_layer: str):
    """A tiny plugin translation model whose embedding rows are far from unit length (so that
    a lookup of the raw rows and one of w_i/‖w_i‖ differ), and its decoder's scores."""
    model, _ = build_model(joined_bin, arch_name("transformer", tying), "--tying", tying,
                           "--output-layer", output_layer)
    model.eval()
    with torch.no_grad():
        for weight in {id(p): p for n, p in model.named_parameters()
                       if n.endswith(("embed_tokens.weight", "scorer.weight"))}.values():
            weight.mul_(3)
    return model


def _lookups(model) -> dict[str, torch.Tensor]:
    """The rows the encoder and decoder look up for every token id."""
    with torch.no_grad():
        return {side: getattr(model, side).embed_tokens(
            torch.arange(getattr(model, side).embed_tokens.num_embeddings))
            for side in ("encoder", "decoder")}


@pytest.mark.parametrize("tying", ["three_way", "decoder", "none"])
def test_baked_matrices_look_up_and_score_as_the_plugin(joined_bin, tying):
    """The stock export's matrices: the input rows the plugin looks up (w_i/‖w_i‖ for l2norm)
    and its scores, without training or decoding."""
    model = _plugin_model(joined_bin, tying, "l2norm")
    args = export_args(arch=arch_name("transformer", tying), tying=tying,
                       output_layer="l2norm", tied_projection=False)
    new, _ = export.bake({k: v.detach() for k, v in model.state_dict().items()}, args)
    want = _lookups(model)
    torch.testing.assert_close(new["encoder.embed_tokens.weight"], want["encoder"])
    torch.testing.assert_close(new["decoder.embed_tokens.weight"], want["decoder"])
    h = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(h @ new["decoder.output_projection.weight"].T,
                                   model.decoder.output_layer(h))


@pytest.mark.parametrize("tying", ["three_way", "decoder"])
def test_ctranslate2_layout_looks_up_and_scores_as_the_plugin(joined_bin, tying):
    """The CTranslate2 export's stock modules: the same lookups (w_i/‖w_i‖ for l2norm) and
    scores as the plugin model they replace."""
    from fairseq_tying.export.ct2 import to_stock_layout

    model = _plugin_model(joined_bin, tying, "l2norm")
    want, h = _lookups(model), torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        scores = model.decoder.output_layer(h)
    to_stock_layout(model)
    got = _lookups(model)
    torch.testing.assert_close(got["encoder"], want["encoder"])
    torch.testing.assert_close(got["decoder"], want["decoder"])
    with torch.no_grad():  # what CTranslate2's converter reads: fairseq's output_projection
        torch.testing.assert_close(model.decoder.output_projection(h), scores)
