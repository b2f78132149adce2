"""sacrebleu scores (detokenized BLEU, tokenized multi-bleu style BLEU, chrF) and ``METRICS``,
the registry of the values of a run that the across-run views report per cell."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

# moses_detokenize is re-exported for the evaluation of Moses-tokenized data.
from fairseq_tying.common.moses import moses_detokenize, moses_tokenize  # noqa: F401

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """fairseq's compound_split_bleu.sh, ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``.

    One non-overlapping pass, exactly like the Perl substitution (``a-b-c`` keeps its second
    hyphen), so that scores stay comparable with published ones.
    """
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenize_for_bleu(lines: Sequence[str], lang: str, compound_split: bool) -> list[str]:
    """Moses tokenization (no escaping, as multi-bleu.perl sees it), then compound splitting."""
    tokens = moses_tokenize(lines, lang)
    return [split_compounds(t) for t in tokens] if compound_split else tokens


def wants_compound_split(src: str, tgt: str) -> bool:
    return src == "en" and tgt == "de"


@dataclass
class Scores:
    bleu: float
    bleu_signature: str
    bleu_verbose: str
    tok_bleu: float
    tok_bleu_signature: str
    tok_bleu_verbose: str
    compound_split: bool
    chrf: float
    chrf_signature: str
    n_sentences: int

    def as_dict(self) -> dict:
        return asdict(self)


def score(hyps: Sequence[str], refs: Sequence[str], src: str, tgt: str) -> Scores:
    """Score detokenized hypotheses against detokenized references."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu = BLEU()
    b = bleu.corpus_score(list(hyps), [list(refs)])
    split = wants_compound_split(src, tgt)
    tok_bleu = BLEU(tokenize="none")
    tb = tok_bleu.corpus_score(
        tokenize_for_bleu(hyps, tgt, split), [tokenize_for_bleu(refs, tgt, split)]
    )
    chrf = CHRF()
    c = chrf.corpus_score(list(hyps), [list(refs)])
    return Scores(
        bleu=b.score,
        bleu_signature=str(bleu.get_signature()),
        bleu_verbose=b.format(),
        tok_bleu=tb.score,
        tok_bleu_signature=f"{tok_bleu.get_signature()}|pretok:moses{'+compound' if split else ''}",
        tok_bleu_verbose=tb.format(),
        compound_split=split,
        chrf=c.score,
        chrf_signature=str(chrf.get_signature()),
        n_sentences=len(hyps),
    )


@dataclass(frozen=True)
class Metric:
    """One value of each run that a view reports per cell (mean ± 95 % CI over its seeds)."""

    path: tuple[str, ...]  # where a study record holds it, e.g. ("eval", "bleu")
    optional: bool = False  # reported only where every run of the cell has it
    scorer: type | None = None  # sacrebleu's metric: paired bootstraps over sentences

    def of(self, record: Any) -> float | None:
        """The run's value (``studies.records.record.Record.value``); None when an optional value is
        missing."""
        return record.value(self.path, self.optional)


# A new metric is one entry: the views report each metric their spec names.
METRICS: dict[str, Metric] = {
    "bleu": Metric(("eval", "bleu"), scorer=BLEU),
    "chrf": Metric(("eval", "chrf"), scorer=CHRF),
    "tok_bleu": Metric(("eval", "tok_bleu")),
    "valid_nll": Metric(("train", "valid", "nll_loss")),
    "bleu_best": Metric(("eval_best", "bleu"), optional=True),
    "test_ppl": Metric(("eval", "perplexity")),
    "test_loss": Metric(("eval", "loss")),
    "test_ppl_best": Metric(("eval_best", "perplexity"), optional=True),
}
