"""Paired bootstrap resampling with sacrebleu's own implementation (``PairedTest``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest


def paired_bootstrap(
    baseline: tuple[str, Sequence[str]],
    systems: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[str],
    n_samples: int = 1000,
) -> dict[str, dict[str, Any]]:
    """p-values of BLEU and chrF differences of each system against the baseline.

    A system whose hypotheses equal the baseline's gets p = 1: every resampled difference
    is then exactly 0 and sacrebleu's strict ``>`` count would report (0 + 1) / (n + 1).
    """
    named = [(baseline[0], list(baseline[1]))] + [(n, list(h)) for n, h in systems]
    for name, hyps in named:
        if len(hyps) != len(refs):
            raise ValueError(f"{name}: {len(hyps)} hypotheses for {len(refs)} references")
    test = PairedTest(named, {"BLEU": BLEU(), "chrF": CHRF()}, [list(refs)], test_type="bs",
                      n_samples=n_samples)
    signatures, scores = test()
    bleu_key, chrf_key = [k for k in scores if k != "System"]
    out: dict[str, dict[str, Any]] = {}
    for i, (name, hyps) in enumerate(named[1:], start=1):
        same = hyps == named[0][1]
        out[name] = {
            "baseline": baseline[0],
            "bleu": scores[bleu_key][i].score,
            "chrf": scores[chrf_key][i].score,
            "bleu_p": 1.0 if same else scores[bleu_key][i].p_value,
            "chrf_p": 1.0 if same else scores[chrf_key][i].p_value,
            "identical_to_baseline": same,
        }
    sigs = {"bleu": str(signatures[bleu_key]), "chrf": str(signatures[chrf_key])}
    for res in out.values():
        res["signatures"] = sigs
    return out
