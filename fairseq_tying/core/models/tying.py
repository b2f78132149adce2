"""Tying modes shared by both model families: flags, validation and embedding construction.

- ``none``       encoder input, decoder input and decoder output each have their own matrix;
- ``decoder``    decoder input = decoder output (DWT, Press & Wolf 2017);
- ``three_way``  encoder input = decoder input = decoder output (TWWT; needs a joined dictionary).
"""

from __future__ import annotations

import logging
from argparse import ArgumentParser, Namespace
from dataclasses import dataclass

from torch import nn

from fairseq_tying.core import output_layers
from fairseq_tying.core.models import guards, pretrained
from fairseq_tying.core.modules import OutputScorer, TiedEmbedding

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TyingMode:
    """A tying mode: which of the three token matrices (encoder input, decoder input, decoder
    output) are one. What a mode shares, how it exports, what it needs of the dictionaries and
    its label are said here; nothing else in the package decides by a mode's name."""

    name: str  # the value of --tying
    label: str  # how a report names it ("three-way tying")
    decoder: bool  # the decoder's input and output are one matrix, the one the layer scores
    encoder: bool = False  # the encoder's input is that matrix too

    @property
    def joined_dictionary(self) -> bool:
        """Whether source and target need one dictionary (fairseq-preprocess
        --joined-dictionary): the encoder looks its tokens up in the decoder's matrix."""
        return self.encoder

    def stock_flags(self, shares_rows: bool) -> dict[str, bool]:
        """Stock fairseq's sharing flags for an export whose output matrix is the decoder's
        input lookup (``shares_rows``: the layer scores with the input rows, no projection
        folded in) or its own matrix."""
        return {"share_all_embeddings": self.encoder and shares_rows,
                "share_decoder_input_output_embed": shares_rows}


UNTIED = TyingMode("none", "untied", decoder=False)
DECODER = TyingMode("decoder", "decoder", decoder=True)  # DWT, Press & Wolf 2017
THREE_WAY = TyingMode("three_way", "three-way", decoder=True, encoder=True)  # TWWT
TYINGS = {mode.name: mode for mode in (UNTIED, DECODER, THREE_WAY)}
TYING_MODES = tuple(TYINGS)


def tying_mode(name: str) -> TyingMode:
    """The tying mode called ``name`` (a --tying value)."""
    return TYINGS[name]


def add_tying_args(parser: ArgumentParser) -> None:
    # No defaults here: fairseq's architecture functions fill them in (see ``tying_defaults``).
    parser.add_argument("--tying", choices=TYING_MODES,
                        help="which embeddings share one matrix (default: set by the --arch)")
    # the registry itself: a layer registered after this parser was built is a choice too
    parser.add_argument("--output-layer", choices=output_layers.OUTPUT_LAYERS,
                        help="how decoder outputs are scored against the tied matrix "
                             f"(default: {output_layers.BASELINE})")
    for setting in output_layers.all_settings():  # a layer's constants (softcap's c)
        parser.add_argument(setting.flag, type=float, metavar="X", help=setting.help)
    parser.add_argument("--tied-projection", action="store_true",
                        help="learned linear map from the decoder output (size H) to the "
                             "embedding size D before the output layer; allows H != D")
    parser.add_argument("--tied-embed-dim", type=int, metavar="D",
                        help="columns of the decoder's (tied) embedding matrix "
                             "(default: --decoder-embed-dim); needs --tied-projection if different")
    parser.add_argument("--output-bias", action="store_true",
                        help="a learned per-token bias b2 added to the output scores "
                             "(s = V·P·h + b2; zero at the start, V parameters)")
    parser.add_argument("--freeze-embeddings", action="store_true",
                        help="keep the embedding matrices (input embeddings, and the output "
                             "matrix when tied) fixed, e.g. pretrained vectors from "
                             "--encoder-embed-path/--decoder-embed-path; all else trains")


def tying_defaults(args: Namespace, tying: str) -> None:
    """The tying flags' defaults of an architecture whose default mode is ``tying``."""
    args.tying = getattr(args, "tying", None) or tying
    args.output_layer = getattr(args, "output_layer", None) or output_layers.BASELINE
    for setting in output_layers.all_settings():
        if getattr(args, setting.name, None) is None:
            setattr(args, setting.name, setting.default)
    args.tied_projection = getattr(args, "tied_projection", False)
    args.tied_embed_dim = getattr(args, "tied_embed_dim", None)
    args.output_bias = getattr(args, "output_bias", False)
    args.freeze_embeddings = getattr(args, "freeze_embeddings", False)


@dataclass(frozen=True)
class TyingSpec:
    mode: str
    output_layer: str
    embed_dim: int  # D, columns of the decoder's embedding matrix
    hidden_dim: int  # H, size of the decoder output fed to the output layer
    projection: bool
    output_bias: bool = False
    settings: tuple[tuple[str, float], ...] = ()  # the output layer's constants, from the flags

    @classmethod
    def from_args(cls, args: Namespace, task) -> TyingSpec:
        """Validate the tying flags against the model flags and the task's dictionaries."""
        hidden = args.decoder_output_dim
        layer = output_layers.get(args.output_layer)
        settings = layer.setting_values({s.name: getattr(args, s.name, None)
                                         for s in layer.settings})
        for setting in layer.settings:
            if not settings[setting.name] > 0:
                raise ValueError(f"{setting.flag} {settings[setting.name]}: give a positive "
                                 f"number (default {setting.default:g})")
        spec = cls(args.tying, args.output_layer, args.tied_embed_dim or args.decoder_embed_dim,
                   hidden, bool(args.tied_projection), bool(getattr(args, "output_bias", False)),
                   tuple(settings.items()))
        if getattr(args, "share_all_embeddings", False) and spec.mode != "three_way":
            raise ValueError(f"--share-all-embeddings conflicts with --tying {spec.mode}; "
                             "use --tying three_way instead")
        if spec.mode == "three_way":
            if task.source_dictionary != task.target_dictionary:
                raise ValueError(
                    "--tying three_way (the *_twwt archs) shares one matrix between source and "
                    "target: binarize the data with fairseq-preprocess --joined-dictionary "
                    "(or use --tying decoder)")
            if args.encoder_embed_dim != spec.embed_dim:
                raise ValueError(
                    f"--tying three_way needs --encoder-embed-dim ({args.encoder_embed_dim}) equal "
                    f"to the tied embedding size D ({spec.embed_dim}; --tied-embed-dim)")
        if spec.mode != "none" and spec.hidden_dim != spec.embed_dim and not spec.projection:
            raise ValueError(
                f"the decoder output size H={spec.hidden_dim} differs from the tied embedding "
                f"size D={spec.embed_dim}: add --tied-projection (a learned H->D map)")
        return spec

    @property
    def normalize_inputs(self) -> bool:
        return self.mode != "none" and output_layers.get(self.output_layer).unit_inputs


def prepare_model(args: Namespace, task, max_positions: int):
    """Validate the flags, set fairseq's sharing flags from ``--tying`` and build the input
    embeddings (filled from pretrained vectors, frozen if asked).
    Returns (spec, encoder embedding, decoder embedding)."""
    args.max_source_positions = getattr(args, "max_source_positions", None) or max_positions
    args.max_target_positions = getattr(args, "max_target_positions", None) or max_positions
    spec = TyingSpec.from_args(args, task)
    guards.check_resume(args)
    args.share_all_embeddings = spec.mode == "three_way"
    args.share_decoder_input_output_embed = spec.mode != "none"
    encoder, decoder = build_embeddings(spec, args, task)
    pretrained.load_pretrained(tying_mode(spec.mode), args, task, encoder, decoder)
    if getattr(args, "freeze_embeddings", False):
        pretrained.freeze(encoder, decoder)
    return spec, encoder, decoder


def build_embeddings(spec: TyingSpec, args: Namespace, task) -> tuple[TiedEmbedding, TiedEmbedding]:
    """Encoder and decoder input embeddings; one module under three-way tying."""
    src, tgt = task.source_dictionary, task.target_dictionary
    decoder_dim = spec.embed_dim if spec.mode != "none" else args.decoder_embed_dim
    decoder = TiedEmbedding(len(tgt), decoder_dim, tgt.pad())
    decoder.normalize_rows = spec.normalize_inputs
    if spec.mode == "three_way":
        return decoder, decoder
    return TiedEmbedding(len(src), args.encoder_embed_dim, src.pad()), decoder


def attach_scorer(decoder: nn.Module, spec: TyingSpec) -> None:
    """Route the decoder's output through an ``OutputScorer`` over the tied (or own) matrix.

    fairseq's decoder has built ``output_projection`` (sharing the embedding when tied); its
    weight moves into ``decoder.scorer`` and ``output_projection`` becomes the identity, so the
    decoder's own forward yields features and ``decoder.output_layer`` yields the scores.
    """
    if decoder.adaptive_softmax is not None:
        raise ValueError("--adaptive-softmax-cutoff is not supported with tied output layers")
    tied = spec.mode != "none"
    weight = decoder.embed_tokens.weight if tied else decoder.output_projection.weight
    projection = None
    if spec.projection:
        projection = nn.Linear(spec.hidden_dim, weight.shape[1], bias=False)
        nn.init.normal_(projection.weight, mean=0, std=spec.hidden_dim**-0.5)
    decoder.scorer = OutputScorer(weight, spec.output_layer, projection, spec.output_bias,
                                  dict(spec.settings))
    decoder.output_projection = nn.Identity()


class ScorerDecoderMixin:
    """``output_layer`` of a decoder whose scores come from ``self.scorer``."""

    def output_layer(self, features):
        return self.scorer(features)

    def upgrade_state_dict_named(self, state_dict, name):
        # fairseq re-adds ``output_projection.weight`` for tied decoders; ours is ``scorer.weight``.
        state_dict = super().upgrade_state_dict_named(state_dict, name) or state_dict
        state_dict.pop(f"{name}.output_projection.weight", None)
        self._match_optional_parameters(state_dict, f"{name}.scorer.")
        return state_dict

    def _match_optional_parameters(self, state_dict, prefix: str) -> None:
        """A checkpoint started on purpose (--finetune-from-model, --reset-optimizer) with
        another --output-bias, --tied-projection or --output-layer: a missing output bias starts
        at zero (the same scores), a missing projection or learned scalar of the layer
        (fixnorm's gain) at its fresh initialization; parameters this model does not have are
        dropped, with a warning."""
        own = {"bias": self.scorer.bias,
               **{name: getattr(self.scorer, name) for name in output_layers.parameter_names()},
               "projection.weight": getattr(self.scorer.projection, "weight", None)}
        for key, param in own.items():
            if param is None and state_dict.pop(prefix + key, None) is not None:
                logger.warning(f"the checkpoint's {prefix + key} is not used by this model")
            elif param is not None and prefix + key not in state_dict:
                logger.warning(f"the checkpoint has no {prefix + key}: it starts "
                               + ("at zero" if key == "bias" else "freshly initialized"))
                state_dict[prefix + key] = param.detach().clone()


class CheckedLoadMixin:
    """``load_state_dict`` that names the embedding rows of a diverged checkpoint (NaN/inf)
    instead of failing later inside beam search."""

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        guards.check_finite(state_dict, {"encoder": self.encoder.dictionary,
                                         "decoder": self.decoder.dictionary})
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
