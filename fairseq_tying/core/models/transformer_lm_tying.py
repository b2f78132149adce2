"""fairseq's Transformer language model with decoder tying and a choice of output layer.

A decoder-only model has two roles for a token matrix, input and output, so ``--tying`` is
``none`` or ``decoder`` (Press & Wolf's tied LM; ``three_way`` needs an encoder). The hidden size
H is ``--decoder-output-dim``; the matrix has D = ``--tied-embed-dim`` columns (default
``--decoder-input-dim``), and H ≠ D needs ``--tied-projection``: the learned map L of
Gulordava et al.'s tied+L, s = score(L·h, W). fairseq's decoder maps D to its model size with
its own input projection, as for ``--decoder-input-dim``.

The presets are fairseq's, value for value: ``transformer_lm_tied`` with ``--tying decoder
--output-layer dot`` builds the model of stock ``--arch transformer_lm
--share-decoder-input-output-embed``, and likewise for ``_big`` and ``_gpt``.
"""

from __future__ import annotations

import dataclasses
from argparse import Namespace

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    transformer_lm_big,
    transformer_lm_gpt,
)

from fairseq_tying.core.models import guards, pretrained
from fairseq_tying.core.models.transformer_tying import TiedTransformerDecoder
from fairseq_tying.core.models.tying import (
    TYINGS,
    TyingSpec,
    add_tying_args,
    attach_scorer,
    tying_defaults,
    tying_mode,
)
from fairseq_tying.core.modules import TiedEmbedding

# no encoder: the modes whose matrix has no encoder role
LM_TYING_MODES = tuple(name for name, mode in TYINGS.items() if not mode.encoder)
# fairseq LM input options that build another embedding module than one token matrix
_OTHER_INPUTS = ("character_embeddings", "adaptive_input", "tie_adaptive_weights")


@register_model("transformer_lm_tying")
class TiedTransformerLanguageModel(TransformerLanguageModel):
    @classmethod
    def add_args(cls, parser):
        # fairseq's LM flags without defaults, so that the architecture functions set them
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_tying_args(parser)
        parser.add_argument("--decoder-embed-path", type=str, metavar="FILE",
                            help="pretrained vectors for the token matrix (fairseq's text format)")

    @classmethod
    def build_model(cls, args, task):
        stock_defaults(args)
        spec = lm_spec(args, task)
        guards.check_resume(args)
        args.share_decoder_input_output_embed = tying_mode(spec.mode).decoder
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample",
                                                DEFAULT_MAX_TARGET_POSITIONS)
        embed = TiedEmbedding(len(task.source_dictionary), spec.embed_dim,
                              task.source_dictionary.pad())
        embed.normalize_rows = spec.normalize_inputs
        load_vectors(args, task, embed, spec)
        decoder = TiedTransformerDecoder(args, task.target_dictionary, embed, no_encoder_attn=True)
        attach_scorer(decoder, spec)
        return cls(decoder)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        guards.check_finite(state_dict, {"decoder": self.decoder.dictionary})
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


def lm_spec(args: Namespace, task) -> TyingSpec:
    """The tying spec of a language model; refuses what has no meaning without an encoder."""
    if args.tying not in LM_TYING_MODES:
        raise ValueError(f"--tying {args.tying}: a language model has no encoder, so its token "
                         f"matrix has two roles only; use --tying decoder (or none)")
    for flag in _OTHER_INPUTS:
        if getattr(args, flag, False):
            raise ValueError(f"--{flag.replace('_', '-')} replaces the token matrix that the "
                             "tied output layers score with; train without it")
    # D is the matrix's width; fairseq's decoder maps D to its model size when they differ
    args.decoder_input_dim = args.tied_embed_dim or args.decoder_input_dim
    args.tied_embed_dim = args.decoder_input_dim
    return TyingSpec.from_args(args, task)


def load_vectors(args: Namespace, task, embed: TiedEmbedding, spec: TyingSpec) -> None:
    path = getattr(args, "decoder_embed_path", None)
    if path:
        pretrained.fill(embed, task.source_dictionary, path, "--decoder-embed-path",
                        "set --tied-embed-dim {D}" + (" --tied-projection"
                                                       if tying_mode(spec.mode).decoder else ""))
    if getattr(args, "freeze_embeddings", False):
        pretrained.freeze(embed)


def stock_defaults(args: Namespace) -> None:
    """Fill what is unset as stock ``--arch transformer_lm`` does: with its dataclass's defaults.
    fairseq registers no architecture function for that preset, so base_lm_architecture's
    values are not its own: it builds post-norm layers (``decoder_normalize_before=False``),
    embeddings of 512 columns whatever ``--decoder-embed-dim`` (``--decoder-input-dim`` and
    ``--decoder-output-dim`` default to 512) and ``base_shuffle=1``."""
    for field in dataclasses.fields(TransformerLanguageModelConfig):
        if field.name == "_name" or hasattr(args, field.name):
            continue
        if field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = field.default
        if value is not dataclasses.MISSING and not str(value).startswith("${"):
            setattr(args, field.name, value)  # II(...) values: fairseq takes those from the task


@register_model_architecture("transformer_lm_tying", "transformer_lm_tied")
def transformer_lm_tied(args: Namespace) -> None:
    tying_defaults(args, "decoder")
    stock_defaults(args)


@register_model_architecture("transformer_lm_tying", "transformer_lm_tied_big")
def transformer_lm_tied_big(args: Namespace) -> None:
    tying_defaults(args, "decoder")
    transformer_lm_big(args)


@register_model_architecture("transformer_lm_tying", "transformer_lm_tied_gpt")
def transformer_lm_tied_gpt(args: Namespace) -> None:
    tying_defaults(args, "decoder")
    transformer_lm_gpt(args)
