"""The plugin's architectures: the registered names and their key defaults, pinned against a
literal table written here (not derived from the code under test), and each built beside the
stock fairseq preset it claims to be."""

from __future__ import annotations

from argparse import Namespace

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY

import fairseq_tying  # noqa: F401  (registration)
from tests.helpers import build_on_meta

# arch -> (model, default tying, embed dim, ffn dim, attention heads, encoder layers, dropout)
ARCHS = {
    "transformer_dwt": ("transformer_tying", "decoder", 512, 2048, 8, 6, 0.1),
    "transformer_twwt": ("transformer_tying", "three_way", 512, 2048, 8, 6, 0.1),
    "transformer_dwt_iwslt_de_en": ("transformer_tying", "decoder", 512, 1024, 4, 6, 0.1),
    "transformer_twwt_iwslt_de_en": ("transformer_tying", "three_way", 512, 1024, 4, 6, 0.1),
    "transformer_dwt_wmt_en_de_big": ("transformer_tying", "decoder", 1024, 4096, 16, 6, 0.3),
    "transformer_twwt_wmt_en_de_big": ("transformer_tying", "three_way", 1024, 4096, 16, 6, 0.3),
    "dynamicconv_dwt": ("dynamicconv_tying", "decoder", 512, 2048, 8, 7, 0.1),
    "dynamicconv_twwt": ("dynamicconv_tying", "three_way", 512, 2048, 8, 7, 0.1),
    "dynamicconv_dwt_iwslt_de_en": ("dynamicconv_tying", "decoder", 512, 1024, 4, 7, 0.1),
    "dynamicconv_twwt_iwslt_de_en": ("dynamicconv_tying", "three_way", 512, 1024, 4, 7, 0.1),
    "dynamicconv_dwt_wmt_en_de_big": ("dynamicconv_tying", "decoder", 1024, 4096, 16, 7, 0.3),
    "dynamicconv_twwt_wmt_en_de_big": ("dynamicconv_tying", "three_way", 1024, 4096, 16, 7,
                                       0.3),
}


def _defaults(arch: str, **given) -> Namespace:
    args = Namespace(**given)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


# the language models' presets are pinned in tests/test_core_lm.py
LM_ARCHS = {"transformer_lm_tied", "transformer_lm_tied_big", "transformer_lm_tied_gpt"}


def test_the_registered_architectures_are_exactly_these():
    ours = {arch for arch, model in ARCH_MODEL_REGISTRY.items()
            if model.__module__.startswith("fairseq_tying")}
    assert ours == set(ARCHS) | LM_ARCHS


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_architecture_has_its_defaults(arch):
    model, tying, dim, ffn, heads, encoder_layers, dropout = ARCHS[arch]
    args = _defaults(arch)
    assert ARCH_MODEL_REGISTRY[arch] is MODEL_REGISTRY[model]
    assert (args.tying, args.output_layer) == (tying, "dot")
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (dim, dim)
    assert (args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim) == (ffn, ffn)
    assert (args.encoder_attention_heads, args.decoder_attention_heads) == (heads, heads)
    assert (args.encoder_layers, args.decoder_layers) == (encoder_layers, 6)
    assert args.dropout == dropout
    assert not (args.tied_projection or args.output_bias or args.freeze_embeddings)
    assert args.tied_embed_dim is None
    if model == "dynamicconv_tying":
        assert (args.encoder_conv_type, args.decoder_conv_type) == ("dynamic", "dynamic")
        assert args.encoder_kernel_size_list == [3, 7, 15, 31, 31, 31, 31]
        assert args.decoder_kernel_size_list == [3, 7, 15, 31, 31, 31]


@pytest.mark.parametrize("arch", ["transformer_twwt", "dynamicconv_dwt_iwslt_de_en"])
def test_flags_given_on_the_command_line_win_over_the_defaults(arch):
    args = _defaults(arch, tying="none", output_layer="l2norm", encoder_layers=3,
                     encoder_embed_dim=64)
    assert (args.tying, args.output_layer) == ("none", "l2norm")
    assert (args.encoder_layers, args.encoder_embed_dim) == (3, 64)
    if arch.startswith("dynamicconv"):
        assert args.encoder_kernel_size_list == [3, 7, 15]  # follows the layer count


# plugin arch -> the stock fairseq arch it is, value for value (the README's table)
STOCK = {
    "transformer": "transformer", "transformer_iwslt_de_en": "transformer_iwslt_de_en",
    "transformer_wmt_en_de_big": "transformer_wmt_en_de_big", "dynamicconv": "lightconv",
    "dynamicconv_iwslt_de_en": "lightconv_iwslt_de_en",
    "dynamicconv_wmt_en_de_big": "lightconv_wmt_en_de_big",
}
SHARE = {"dwt": "--share-decoder-input-output-embed", "twwt": "--share-all-embeddings"}
# set by fairseq's own TransformerModel.build_model for FSDP wrapping, which the plugin's
# build does not do (fully sharded training is not supported)
NOT_COMPARED = {"arch", "_name", "min_params_to_wrap"}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_architecture_builds_its_stock_fairseq_model(joined_bin, arch):
    """With --output-layer dot, each arch is fairseq-train's stock preset with the matching
    sharing flag: every stock hyper-parameter equal, every parameter of the same shape (the
    plugin's output matrix is its scorer's)."""
    mode = "twwt" if "_twwt" in arch else "dwt"
    stock = STOCK[arch.replace(f"_{mode}", "")]
    _, stock_args, stock = build_on_meta(joined_bin, stock, SHARE[mode])
    _, args, model = build_on_meta(joined_bin, arch)
    want = {k: v for k, v in vars(stock_args).items() if k not in NOT_COMPARED}
    assert {k: getattr(args, k, "<unset>") for k in want} == want

    def shapes(m, output_key: str) -> dict:
        return {("output" if k == output_key else k): tuple(v.shape)
                for k, v in m.state_dict().items()}

    assert shapes(model, "decoder.scorer.weight") == shapes(
        stock, "decoder.output_projection.weight")
