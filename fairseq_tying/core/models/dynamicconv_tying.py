"""DynamicConv (fairseq's lightconv family, dynamic convolutions) with tying and output layers."""

from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.lightconv import (
    LightConvDecoder,
    LightConvEncoder,
    LightConvModel,
    lightconv_iwslt_de_en,
    lightconv_wmt_en_de_big,
)
from fairseq.models.lightconv import base_architecture as lightconv_base

from fairseq_tying.core.models.tying import (
    CheckedLoadMixin,
    ScorerDecoderMixin,
    add_tying_args,
    attach_scorer,
    prepare_model,
    tying_defaults,
)

# fairseq's default kernel sizes per block (7 encoder blocks, 6 decoder blocks).
KERNEL_SIZES = [3, 7, 15, 31, 31, 31, 31]


class DynamicConvDecoder(ScorerDecoderMixin, LightConvDecoder):
    """fairseq's lightconv decoder split into ``extract_features`` and ``output_layer``.

    ``attach_scorer`` makes the stock forward stop at the features (its output projection is
    the identity), so ``extract_features`` is that forward and scores come from ``self.scorer``.
    """

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         **kwargs):
        return super().forward(prev_output_tokens, encoder_out, incremental_state)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only: bool = False, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return (x if features_only else self.output_layer(x)), extra


@register_model("dynamicconv_tying")
class DynamicConvModel(CheckedLoadMixin, LightConvModel):
    @staticmethod
    def add_args(parser):
        LightConvModel.add_args(parser)
        add_tying_args(parser)

    @classmethod
    def build_model(cls, args, task):
        lightconv_base(args)
        if args.encoder_embed_dim != args.decoder_embed_dim:
            # fairseq's lightconv decoder attends over encoder states of its own width H
            raise ValueError(
                f"--arch {args.arch}: the DynamicConv decoder needs --encoder-embed-dim "
                f"({args.encoder_embed_dim}) equal to --decoder-embed-dim "
                f"({args.decoder_embed_dim}); under --tying three_way the encoder works at the "
                "tied size D, so D != H needs transformer_twwt or --tying decoder")
        spec, encoder_embed, decoder_embed = prepare_model(args, task, max_positions=1024)
        encoder = LightConvEncoder(args, task.source_dictionary, encoder_embed)
        decoder = DynamicConvDecoder(args, task.target_dictionary, decoder_embed)
        attach_scorer(decoder, spec)
        return cls(encoder, decoder)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, features_only: bool = False):
        """fairseq's, plus ``features_only`` (the decoder output before the output layer), as
        the Transformer has it: --chunked-loss scores the features itself."""
        encoder_out = self.encoder(src_tokens, src_lengths)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out,
                            features_only=features_only)


def _kernel_sizes(layers: int) -> list[int]:
    return (KERNEL_SIZES + [KERNEL_SIZES[-1]] * layers)[:layers]


def dynamic_defaults(args) -> None:
    args.encoder_conv_type = getattr(args, "encoder_conv_type", "dynamic")
    args.decoder_conv_type = getattr(args, "decoder_conv_type", "dynamic")
    args.encoder_layers = getattr(args, "encoder_layers", 7)
    args.decoder_layers = getattr(args, "decoder_layers", 6)
    # Kernel-size lists follow the layer counts unless given explicitly.
    args.encoder_kernel_size_list = getattr(
        args, "encoder_kernel_size_list", _kernel_sizes(args.encoder_layers))
    args.decoder_kernel_size_list = getattr(
        args, "decoder_kernel_size_list", _kernel_sizes(args.decoder_layers))


# The architectures: a tying default (--tying, overridable), the dynamic-convolution
# defaults, then fairseq's lightconv preset.

@register_model_architecture("dynamicconv_tying", "dynamicconv_dwt")
def dynamicconv_dwt(args) -> None:
    tying_defaults(args, "decoder")
    dynamic_defaults(args)
    lightconv_base(args)


@register_model_architecture("dynamicconv_tying", "dynamicconv_twwt")
def dynamicconv_twwt(args) -> None:
    tying_defaults(args, "three_way")
    dynamic_defaults(args)
    lightconv_base(args)


@register_model_architecture("dynamicconv_tying", "dynamicconv_dwt_iwslt_de_en")
def dynamicconv_dwt_iwslt_de_en(args) -> None:
    tying_defaults(args, "decoder")
    dynamic_defaults(args)
    lightconv_iwslt_de_en(args)


@register_model_architecture("dynamicconv_tying", "dynamicconv_twwt_iwslt_de_en")
def dynamicconv_twwt_iwslt_de_en(args) -> None:
    tying_defaults(args, "three_way")
    dynamic_defaults(args)
    lightconv_iwslt_de_en(args)


@register_model_architecture("dynamicconv_tying", "dynamicconv_dwt_wmt_en_de_big")
def dynamicconv_dwt_wmt_en_de_big(args) -> None:
    tying_defaults(args, "decoder")
    dynamic_defaults(args)
    lightconv_wmt_en_de_big(args)


@register_model_architecture("dynamicconv_tying", "dynamicconv_twwt_wmt_en_de_big")
def dynamicconv_twwt_wmt_en_de_big(args) -> None:
    tying_defaults(args, "three_way")
    dynamic_defaults(args)
    lightconv_wmt_en_de_big(args)
