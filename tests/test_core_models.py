"""Tying by tensor identity, parameter counts, gradients, incremental decoding and the cache."""

from __future__ import annotations

import pytest
import torch

from fairseq_tying.core import names, output_layers
from tests.helpers import arch_name, build_model, decode_full_and_incremental

FAMILIES = ["transformer", "dynamicconv"]


def _model(data, family, tying="three_way", output_layer="dot", *flags):
    model, task = build_model(data, arch_name(family, tying), "--tying", tying,
                              "--output-layer", output_layer, *flags)
    return model, task


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_three_way_tying_shares_one_tensor(joined_bin, family):
    model, _ = _model(joined_bin, family, "three_way", "l2norm")
    enc, dec = model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight
    out = model.decoder.scorer.weight
    assert enc is dec is out
    assert enc.data_ptr() == out.data_ptr()
    assert model.encoder.embed_tokens.normalize_rows  # l2norm: input lookups normalized too


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_tying_shares_two_roles(joined_bin, family):
    model, _ = _model(joined_bin, family, "decoder", "cosine")
    assert model.decoder.embed_tokens.weight is model.decoder.scorer.weight
    assert model.encoder.embed_tokens.weight is not model.decoder.scorer.weight
    assert model.encoder.embed_tokens.weight.data_ptr() != model.decoder.scorer.weight.data_ptr()
    assert not model.decoder.embed_tokens.normalize_rows  # cosine: raw input lookups


@pytest.mark.parametrize("family", FAMILIES)
def test_untied_has_three_matrices(joined_bin, family):
    model, _ = _model(joined_bin, family, "none", "dot")
    weights = {id(model.encoder.embed_tokens.weight), id(model.decoder.embed_tokens.weight),
               id(model.decoder.scorer.weight)}
    assert len(weights) == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_counts_follow_the_formula(joined_bin, family):
    counts = {t: _n_params(_model(joined_bin, family, t)[0]) for t in ("none", "decoder",
                                                                        "three_way")}
    _, task = _model(joined_bin, family)
    vocab, dim = len(task.target_dictionary), 16
    assert counts["none"] - counts["decoder"] == vocab * dim  # the output matrix
    assert counts["decoder"] - counts["three_way"] == vocab * dim  # the encoder embedding
    with_projection = _n_params(_model(joined_bin, family, "three_way", "dot",
                                       "--tied-projection")[0])
    assert with_projection - counts["three_way"] == dim * dim


def test_twwt_has_exactly_the_parameters_of_fairseqs_shared_transformer(joined_bin):
    ours, _ = _model(joined_bin, "transformer", "three_way", "sqnorm")
    stock, _ = build_model(joined_bin, "transformer", "--share-all-embeddings")
    assert _n_params(ours) == _n_params(stock)


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_gradients_reach_the_shared_matrix_from_both_roles(joined_bin, output_layer):
    model, task = _model(joined_bin, "transformer", "three_way", output_layer)
    weight = model.decoder.scorer.weight
    src = torch.tensor([[5, 6, 7, task.source_dictionary.eos()]])
    encoded = model.encoder(src, src_lengths=torch.tensor([4]))["encoder_out"][0]
    # a plain sum would be constant after the final LayerNorm
    (encoded * torch.randn_like(encoded)).sum().backward()
    input_grad = weight.grad.clone()
    assert input_grad[[5, 6, 7]].abs().sum() > 0 and input_grad[8:].abs().sum() == 0
    weight.grad = None
    model.decoder.output_layer(torch.randn(2, 3, 16)).logsumexp(-1).sum().backward()
    assert weight.grad[8:].abs().sum() > 0  # rows never looked up learn through the output


@pytest.mark.parametrize("output_layer", output_layers.names())
@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decoding_equals_full_forward(joined_bin, family, output_layer):
    torch.manual_seed(0)
    model, task = _model(joined_bin, family, "three_way", output_layer, "--tied-projection")
    model.eval()
    enc, prev, full, steps = decode_full_and_incremental(model, task)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)
    features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
    torch.testing.assert_close(model.decoder.output_layer(features), full)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_layer_applies_the_rule_to_the_projected_features(joined_bin, family):
    model, _ = _model(joined_bin, family, "three_way", "distance", "--tied-projection")
    scorer = model.decoder.scorer
    h = torch.randn(3, 16)
    want = output_layers.scores("distance", scorer.projection(h), scorer.weight)
    torch.testing.assert_close(model.decoder.output_layer(h), want)


def test_the_state_dict_names_the_tools_use_are_the_models(joined_bin):
    """core/names.py spells the keys export, analysis, bench and norms read: each names the
    matrix it says, in the plugin's model and (the names of stock's output) in fairseq's."""
    model, _ = _model(joined_bin, "transformer", "none", "dot", "--tied-projection",
                      "--tied-embed-dim", "8")
    state = model.state_dict()
    assert state[names.SCORER_WEIGHT].data_ptr() == model.decoder.scorer.weight.data_ptr()
    assert state[names.SCORER_PROJECTION].data_ptr() == (
        model.decoder.scorer.projection.weight.data_ptr())
    assert state[names.DECODER_EMBED].data_ptr() == model.decoder.embed_tokens.weight.data_ptr()
    assert state[names.ENCODER_EMBED].data_ptr() == model.encoder.embed_tokens.weight.data_ptr()
    assert {k for k in state if k.startswith(names.SCORER_PREFIX)} == {
        names.SCORER_WEIGHT, names.SCORER_PROJECTION}
    stock, _ = build_model(joined_bin, "transformer")
    assert stock.state_dict()[names.OUTPUT_PROJECTION].data_ptr() == (
        stock.decoder.output_projection.weight.data_ptr())


def test_hidden_size_differs_from_embedding_size_with_projection(joined_bin):
    model, _ = _model(joined_bin, "transformer", "decoder", "l2norm", "--tied-projection",
                      "--tied-embed-dim", "8")
    assert model.decoder.scorer.weight.shape[1] == 8
    assert model.decoder.scorer.projection.weight.shape == (8, 16)
    out, _ = model(torch.tensor([[5, 6, 2]]), torch.tensor([3]), torch.tensor([[2, 5]]))
    assert out.shape[-1] == len(model.decoder.dictionary) and torch.isfinite(out).all()


class TestCache:
    """In eval mode (no autograd) the normalized matrix is computed once and reused; it must
    never be used after the weights could have changed."""

    def _scorer(self, joined_bin, output_layer="l2norm"):
        model, _ = _model(joined_bin, "transformer", "three_way", output_layer)
        return model, model.decoder.scorer

    def _fresh(self, scorer, h):
        return output_layers.scores(scorer.output_layer, h, scorer.weight, gain=scorer.gain)

    def test_cached_once_in_eval(self, joined_bin):
        model, scorer = self._scorer(joined_bin)
        model.eval()
        with torch.no_grad():
            a = scorer.output_matrix_and_bias()[0]
            b = scorer.output_matrix_and_bias()[0]
        assert a is b
        model.train()
        with torch.no_grad():
            assert scorer.output_matrix_and_bias()[0] is not a  # training: computed afresh
            model.eval()
            c = scorer.output_matrix_and_bias()[0]
        assert c is not a  # train() dropped the cache
        torch.testing.assert_close(c, a, rtol=0, atol=0)

    def test_in_place_update_invalidates(self, joined_bin):
        model, scorer = self._scorer(joined_bin, "sqnorm")
        model.eval()
        h = torch.randn(2, 16)
        with torch.no_grad():
            scorer(h)
            scorer.weight.mul_(3)
            torch.testing.assert_close(scorer(h), self._fresh(scorer, h))

    def test_optimizer_step_invalidates_even_through_param_data(self, joined_bin):
        model, scorer = self._scorer(joined_bin, "cosine")
        model.eval()
        h = torch.randn(2, 16)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        with torch.no_grad():
            scorer(h)
        opt.step = _step_through_data(opt, scorer.weight)
        opt.step()
        with torch.no_grad():
            torch.testing.assert_close(scorer(h), self._fresh(scorer, h))

    def test_load_state_dict_invalidates(self, joined_bin):
        model, scorer = self._scorer(joined_bin, "distance")
        other, _ = self._scorer(joined_bin, "distance")
        model.eval()
        h = torch.randn(2, 16)
        with torch.no_grad():
            before = scorer(h)
            model.load_state_dict(other.state_dict())
            after = scorer(h)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, self._fresh(scorer, h))


def _step_through_data(opt: torch.optim.Optimizer, weight: torch.nn.Parameter):
    """An optimizer whose update writes through ``param.data`` (no version bump), as fairseq's
    fp16 optimizers do, still wrapped by torch's step hooks."""

    class DataWriter(torch.optim.Optimizer):
        def step(self, closure=None):
            weight.data.copy_(weight.data * 2 + 1)

    return DataWriter([weight], {}).step


def test_architecture_presets_are_fairseqs():
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY as presets

    def filled(arch: str) -> Namespace:
        args = Namespace()
        presets[arch](args)
        return args

    iwslt = filled("transformer_twwt_iwslt_de_en")
    assert (iwslt.encoder_layers, iwslt.decoder_layers, iwslt.encoder_embed_dim,
            iwslt.encoder_ffn_embed_dim, iwslt.encoder_attention_heads) == (6, 6, 512, 1024, 4)
    assert iwslt.tying == "three_way" and iwslt.output_layer == "dot"
    big = filled("transformer_dwt_wmt_en_de_big")
    assert (big.encoder_embed_dim, big.encoder_attention_heads, big.tying) == (1024, 16, "decoder")
    conv = filled("dynamicconv_twwt_iwslt_de_en")
    assert (conv.encoder_layers, conv.decoder_layers) == (7, 6)
    assert conv.encoder_conv_type == conv.decoder_conv_type == "dynamic"
    assert len(conv.encoder_kernel_size_list) == 7 and len(conv.decoder_kernel_size_list) == 6
    short = Namespace(encoder_layers=2, decoder_layers=1)
    presets["dynamicconv_dwt_wmt_en_de_big"](short)
    assert short.encoder_kernel_size_list == [3, 7] and short.decoder_kernel_size_list == [3]
    assert short.encoder_embed_dim == 1024
