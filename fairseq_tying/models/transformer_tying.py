"""Transformer with decoder / three-way tying and a choice of output layer."""

from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerDecoder, TransformerModel
from fairseq.models.transformer.transformer_config import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
)
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de_big,
)

from fairseq_tying.models.tying import (
    ScorerDecoderMixin,
    TyingSpec,
    add_tying_args,
    attach_scorer,
    build_embeddings,
    tying_defaults,
)


class TiedTransformerDecoder(ScorerDecoderMixin, TransformerDecoder):
    """fairseq's decoder; ``output_layer`` applies the chosen scoring rule."""


@register_model("transformer_tying")
class TiedTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_tying_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        args.max_source_positions = getattr(args, "max_source_positions", None) or DEFAULT_MAX_SOURCE_POSITIONS
        args.max_target_positions = getattr(args, "max_target_positions", None) or DEFAULT_MAX_TARGET_POSITIONS
        spec = TyingSpec.from_args(args, task)
        args.share_all_embeddings = spec.mode == "three_way"
        args.share_decoder_input_output_embed = spec.mode != "none"
        encoder_embed, decoder_embed = build_embeddings(spec, args, task)
        encoder = cls.build_encoder(args, task.source_dictionary, encoder_embed)
        decoder = TiedTransformerDecoder(args, task.target_dictionary, decoder_embed)
        attach_scorer(decoder, spec)
        return cls(args, encoder, decoder)


def _register(name: str, preset, tying: str) -> None:
    def architecture(args):
        tying_defaults(args, tying)
        preset(args)

    register_model_architecture("transformer_tying", name)(architecture)


for _suffix, _preset in (("", base_architecture), ("_iwslt_de_en", transformer_iwslt_de_en),
                         ("_wmt_en_de_big", transformer_wmt_en_de_big)):
    _register(f"transformer_dwt{_suffix}", _preset, "decoder")
    _register(f"transformer_twwt{_suffix}", _preset, "three_way")
