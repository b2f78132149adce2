"""Transformer with decoder / three-way tying and a choice of output layer."""

from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerDecoder, TransformerModel
from fairseq.models.transformer.transformer_config import (
    DEFAULT_MAX_SOURCE_POSITIONS as DEFAULT_MAX_POSITIONS,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de_big,
)

from fairseq_tying.core.models.tying import (
    CheckedLoadMixin,
    ScorerDecoderMixin,
    add_tying_args,
    attach_scorer,
    prepare_model,
    tying_defaults,
)


class TiedTransformerDecoder(ScorerDecoderMixin, TransformerDecoder):
    """fairseq's decoder; ``output_layer`` applies the chosen output layer."""


@register_model("transformer_tying")
class TiedTransformerModel(CheckedLoadMixin, TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_tying_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        spec, encoder_embed, decoder_embed = prepare_model(args, task, DEFAULT_MAX_POSITIONS)
        encoder = cls.build_encoder(args, task.source_dictionary, encoder_embed)
        decoder = TiedTransformerDecoder(args, task.target_dictionary, decoder_embed)
        attach_scorer(decoder, spec)
        return cls(args, encoder, decoder)


# The architectures: a tying default (--tying, overridable), then fairseq's preset.

@register_model_architecture("transformer_tying", "transformer_dwt")
def transformer_dwt(args) -> None:
    tying_defaults(args, "decoder")
    base_architecture(args)


@register_model_architecture("transformer_tying", "transformer_twwt")
def transformer_twwt(args) -> None:
    tying_defaults(args, "three_way")
    base_architecture(args)


@register_model_architecture("transformer_tying", "transformer_dwt_iwslt_de_en")
def transformer_dwt_iwslt_de_en(args) -> None:
    tying_defaults(args, "decoder")
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_tying", "transformer_twwt_iwslt_de_en")
def transformer_twwt_iwslt_de_en(args) -> None:
    tying_defaults(args, "three_way")
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_tying", "transformer_dwt_wmt_en_de_big")
def transformer_dwt_wmt_en_de_big(args) -> None:
    tying_defaults(args, "decoder")
    transformer_wmt_en_de_big(args)


@register_model_architecture("transformer_tying", "transformer_twwt_wmt_en_de_big")
def transformer_twwt_wmt_en_de_big(args) -> None:
    tying_defaults(args, "three_way")
    transformer_wmt_en_de_big(args)
