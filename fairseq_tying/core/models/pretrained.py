"""Pretrained vectors (GloVe, fastText, word2vec in fairseq's text format) in the tied matrices.

``--encoder-embed-path`` / ``--decoder-embed-path`` name a file with a header line, then one
``token v1 … vD`` line per token (fairseq's ``utils.parse_embedding``). The rows of matching
dictionary entries are overwritten; the others keep their random initialization, and the
padding row stays zero. Under three-way tying either flag fills the one shared matrix.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path

import torch
from fairseq import utils
from fairseq.data import Dictionary
from torch import nn

logger = logging.getLogger(__name__)


def read_vectors(path: str, flag: str) -> tuple[dict[str, torch.Tensor], int]:
    """The file's vectors by token and their size D; every line must have the same D."""
    if not Path(path).is_file():
        raise ValueError(
            f"{flag} {path}: no such file. (Loading a checkpoint trained with it from another "
            f"place? The vectors are in the checkpoint: pass --model-overrides "
            f"\"{{'{flag[2:].replace('-', '_')}': None}}\")")
    try:
        vectors = utils.parse_embedding(path)
    except StopIteration:
        raise ValueError(f"{flag} {path} is empty; expected a header line, then "
                         "'token v1 … vD' lines") from None
    except ValueError as e:
        raise ValueError(f"{flag} {path}: not fairseq's text embedding format ({e})") from None
    sizes = {v.numel() for v in vectors.values()}
    if len(sizes) != 1:
        raise ValueError(f"{flag} {path}: lines have different vector sizes {sorted(sizes)}"
                         if sizes else f"{flag} {path} holds no vectors after its header line")
    return vectors, sizes.pop()


def fill(embedding: nn.Embedding, dictionary: Dictionary, path: str, flag: str,
         size_hint: str) -> int:
    """Copy the file's vectors into the rows of ``embedding`` for the dictionary's tokens.

    ``size_hint`` names the flags that make the matrix as wide as the file's vectors.
    Returns how many dictionary entries got a vector."""
    vectors, dim = read_vectors(path, flag)
    if dim != embedding.embedding_dim:
        raise ValueError(f"{flag} {path} holds vectors of size D={dim}, but the matrix it fills "
                         f"has {embedding.embedding_dim} columns: {size_hint.format(D=dim)}")
    found = [i for i, token in enumerate(dictionary.symbols)
             if token in vectors and i != embedding.padding_idx]
    if not found:
        raise ValueError(f"{flag} {path}: none of the dictionary's {len(dictionary)} entries has "
                         "a vector (were the vectors trained on the same subword pieces as the "
                         "binarized data?)")
    with torch.no_grad():
        rows = torch.stack([vectors[dictionary[i]] for i in found])
        embedding.weight[found] = rows.to(embedding.weight)
    logger.info(f"{flag} {path}: {len(found)} of {len(dictionary)} dictionary entries got a "
                f"{dim}-d vector")
    return len(found)


def load_pretrained(mode, args: Namespace, task, encoder: nn.Embedding,
                    decoder: nn.Embedding) -> None:
    """Fill the matrices named by ``--encoder-embed-path`` / ``--decoder-embed-path``; ``mode``:
    the model's ``tying.TyingMode`` (not imported here: tying.py imports this module)."""
    enc_path = getattr(args, "encoder_embed_path", None)
    dec_path = getattr(args, "decoder_embed_path", None)
    tied_hint = ("add --tied-embed-dim {D} --tied-projection (the decoder then works at its "
                 f"hidden size H={args.decoder_embed_dim} and maps to and from D)")
    if mode.encoder:
        if enc_path and dec_path and enc_path != dec_path:
            raise ValueError(
                f"--tying three_way has one matrix for all three roles, but --encoder-embed-path "
                f"{enc_path} and --decoder-embed-path {dec_path} name two files: give one of them")
        path = enc_path or dec_path
        if path:
            flag = "--encoder-embed-path" if enc_path else "--decoder-embed-path"
            fill(decoder, task.target_dictionary, path, flag,
                 tied_hint[:-1] + "; the encoder works at D: --encoder-embed-dim {D})")
        return
    if enc_path:
        fill(encoder, task.source_dictionary, enc_path, "--encoder-embed-path",
             "set --encoder-embed-dim {D}")
    if dec_path:
        hint = tied_hint if mode.decoder else "set --decoder-embed-dim {D}"
        fill(decoder, task.target_dictionary, dec_path, "--decoder-embed-path", hint)


def freeze(*embeddings: nn.Embedding) -> None:
    """Keep these matrices fixed: fairseq's optimizer only takes parameters with
    ``requires_grad``, so everything else (the projection included) still trains."""
    for embedding in embeddings:
        embedding.weight.requires_grad_(False)
