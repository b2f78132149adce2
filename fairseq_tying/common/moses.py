"""Moses tokenization (sacremoses), one tokenizer and one detokenizer per language, cached.

Tokens are never escaped (``&`` stays ``&``, not ``&amp;``): the text goes to subword models,
fairseq dictionaries and BLEU as it is, as in fairseq's recipes and multi-bleu.perl's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from sacremoses import MosesDetokenizer, MosesTokenizer


@cache
def _tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


@cache
def _detokenizer(lang: str) -> MosesDetokenizer:
    return MosesDetokenizer(lang=lang)


def tokenize(line: str, lang: str) -> str:
    """One sentence, tokens joined by single spaces."""
    return _tokenizer(lang).tokenize(line, escape=False, return_str=True)


def tokens(line: str, lang: str) -> list[str]:
    """One sentence as a list of tokens."""
    return _tokenizer(lang).tokenize(line, escape=False)


def detokenize(words: Sequence[str], lang: str) -> str:
    """Inverse of :func:`tokens`: one sentence from its tokens."""
    return _detokenizer(lang).detokenize(list(words))


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    return [tokenize(line, lang) for line in lines]


def moses_detokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Inverse of :func:`moses_tokenize`, line by line (tokens split on whitespace)."""
    return [detokenize(line.split(), lang) for line in lines]
