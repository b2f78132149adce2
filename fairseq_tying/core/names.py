"""State-dict names of a plugin model's matrices, spelled once for the tools that read or write
checkpoints (export, analysis, bench, evaluation).

``attach_scorer`` (:mod:`.models.tying`) puts the output layer on the decoder as ``scorer``
(:class:`~fairseq_tying.core.modules.OutputScorer`): its ``weight`` is W, the output embedding
(the decoder's input embedding when tied), and ``projection`` the L of
``--tied-projection``. The input embeddings are fairseq's own ``embed_tokens``.
"""

SCORER_PREFIX = "decoder.scorer."
SCORER_WEIGHT = "decoder.scorer.weight"
SCORER_PROJECTION = "decoder.scorer.projection.weight"
ENCODER_EMBED = "encoder.embed_tokens.weight"
DECODER_EMBED = "decoder.embed_tokens.weight"

# stock fairseq's decoder output, which the scorer replaces (the stock export writes it back)
OUTPUT_PROJECTION = "decoder.output_projection.weight"
PROJECT_OUT_DIM = "decoder.project_out_dim.weight"  # transformer_lm's M -> --decoder-output-dim
EMBED_OUT = "decoder.embed_out"  # older fairseq decoders' output matrix
