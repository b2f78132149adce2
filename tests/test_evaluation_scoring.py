"""Scores against sacrebleu's own CLI, the paired bootstrap, the CI over seeds, presets."""

from __future__ import annotations

import inspect
import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from fairseq_tying.common.eval_options import evaluate_options, preset_for_arch, resolve_preset
from fairseq_tying.evaluation import metrics
from fairseq_tying.evaluation.evaluate import evaluate_run
from fairseq_tying.evaluation.generate import parse_hypotheses
from fairseq_tying.evaluation.perplexity import evaluate_lm_run
from fairseq_tying.studies.records.record import Identity, Record
from fairseq_tying.studies.statistics.significance import (
    bleu_scores,
    chrf_scores,
    compare,
    metric_stats,
    resample_counts,
    seed_paired_bootstrap,
)
from fairseq_tying.studies.statistics.stats import (
    detectable,
    mean_ci,
    seeds_for_equivalence,
    tost,
    tost_power,
)
from fairseq_tying.studies.views.formatting import format_ci
from tests.helpers import REPO, run_cli

REFS = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a well-known fact that state-of-the-art systems aren't perfect.",
    "\"Hello,\" she said, (quietly) and left at 10:30.",
    "Das Haus ist sehr groß.",
    "One more line without punctuation",
]
HYPS = [
    "The quick brown fox jumped over a lazy dog.",
    "It is a well-known fact that state-of-the-art systems are not perfect.",
    "\"Hello\", she said quietly and left at 10:30.",
    "Das Haus ist groß.",
    "One more line with no punctuation",
]


def _cli(ref: Path, hyp: Path, *args: str) -> list[dict]:
    out = run_cli("sacrebleu", str(ref), "-i", str(hyp), "-w", "6", *args).stdout
    data = json.loads(out)
    return data if isinstance(data, list) else [data]


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("\n".join(REFS) + "\n")
    hyp.write_text("\n".join(HYPS) + "\n")
    return ref, hyp


def test_detokenized_bleu_and_chrf_match_sacrebleu_cli(files):
    ref, hyp = files
    bleu, chrf = _cli(ref, hyp, "-m", "bleu", "chrf")
    s = metrics.score(HYPS, REFS, "es", "en")
    assert 0 < s.bleu < 100 and 0 < s.chrf < 100
    assert s.bleu == pytest.approx(bleu["score"], abs=1e-5)
    assert s.chrf == pytest.approx(chrf["score"], abs=1e-5)
    assert s.bleu_signature == bleu["signature"]
    assert s.chrf_signature == chrf["signature"]
    assert s.n_sentences == len(REFS)


def test_tokenized_bleu_matches_cli_on_moses_tokenized_text(files, tmp_path):
    tok_ref, tok_hyp = tmp_path / "ref.tok", tmp_path / "hyp.tok"
    tok_ref.write_text("\n".join(metrics.tokenize_for_bleu(REFS, "en", False)) + "\n")
    tok_hyp.write_text("\n".join(metrics.tokenize_for_bleu(HYPS, "en", False)) + "\n")
    # Moses tokenization as multi-bleu.perl expects it: punctuation split, nothing escaped.
    expected = '" Hello , " she said , ( quietly ) and left at 10 : 30 .'
    assert tok_ref.read_text().splitlines()[2] == expected
    [cli] = _cli(tok_ref, tok_hyp, "-m", "bleu", "--tokenize", "none")
    s = metrics.score(HYPS, REFS, "es", "en")
    assert s.tok_bleu == pytest.approx(cli["score"], abs=1e-5)
    assert s.tok_bleu != pytest.approx(s.bleu, abs=1e-3)  # tokenization really differs
    assert "tok:none" in s.tok_bleu_signature and not s.compound_split


def test_compound_splitting_equals_fairseq_perl_one_liner():
    lines = ["state-of-the-art e-mail x - y", "Hof-Test a-b-c"]
    ours = [metrics.split_compounds(x) for x in lines]
    assert ours[0] == ("state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art "
                       "e ##AT##-##AT## mail x - y")
    assert ours[1] == "Hof ##AT##-##AT## Test a ##AT##-##AT## b-c"
    if shutil.which("perl"):
        perl = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
                              input="\n".join(lines) + "\n", capture_output=True, text=True,
                              check=True).stdout.splitlines()
        assert ours == perl


def test_compound_splitting_only_for_english_german():
    de = metrics.score(HYPS, REFS, "en", "de")
    en = metrics.score(HYPS, REFS, "de", "en")
    assert de.compound_split and not en.compound_split
    assert de.tok_bleu != pytest.approx(en.tok_bleu, abs=1e-6)
    assert "compound" in de.tok_bleu_signature


def test_moses_detokenizer_for_moses_tokenized_data():
    tok = ["Hello , world ! It 's a \" test \" ( really ) .", "Das ist 3,5 % mehr ."]
    assert metrics.moses_detokenize(tok[:1], "en") == ["Hello, world! It's a \"test\" (really)."]
    assert metrics.moses_detokenize(tok[1:], "de") == ["Das ist 3,5% mehr."]


def test_identical_output_scores_100():
    s = metrics.score(REFS, REFS, "es", "en")
    assert s.bleu == pytest.approx(100) and s.tok_bleu == pytest.approx(100)
    assert s.chrf == pytest.approx(100)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="4 hypotheses but 5 references"):
        metrics.score(HYPS[:4], REFS, "es", "en")


def _corpus(seed: int = 0):
    rng = random.Random(seed)
    words = "the a cat dog house big small red runs eats water bread and not very".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(150)]

    def corrupt(p: float) -> list[str]:
        return [" ".join(w if rng.random() > p else rng.choice(words) for w in r.split())
                for r in refs]

    return refs, corrupt(0.1), corrupt(0.4)


def _sacrebleu_paired(base: list[str], system: list[str], refs: list[str], n: int) -> dict:
    """sacrebleu's own paired bootstrap test (the reference implementation): p and score."""
    test = PairedTest([("base", base), ("system", system)], {"BLEU": BLEU(), "chrF": CHRF()},
                      [refs], test_type="bs", n_samples=n)
    _, scores = test()
    bleu, chrf = [k for k in scores if k != "System"]
    return {"bleu": scores[bleu][1].score, "bleu_p": scores[bleu][1].p_value,
            "chrf_p": scores[chrf][1].p_value}


def _two_sided_by_hand(system: list[str], base: list[str], refs: list[str], n: int) -> float:
    """The two-sided paired bootstrap p written out: sacrebleu's draws (seed 12345), each
    resample's corpus BLEU by sacrebleu, p = (#{|m_b − m̄| ≥ |d|} + 1) / (B + 1)."""
    bleu = BLEU()
    d = bleu.corpus_score(system, [refs]).score - bleu.corpus_score(base, [refs]).score
    idxs = np.random.default_rng(12345).choice(len(refs), size=(n, len(refs)))
    m = np.array([bleu.corpus_score([system[i] for i in row], [[refs[i] for i in row]]).score
                  - bleu.corpus_score([base[i] for i in row], [[refs[i] for i in row]]).score
                  for row in idxs])
    return (int(np.sum(np.abs(m - m.mean()) >= abs(d))) + 1) / (n + 1)


def test_compare_per_seed_p_is_the_two_sided_bootstrap_written_out():
    refs, good, bad = _corpus()
    near = list(good)
    near[3] = bad[3]
    runs = {name: Record(Identity(name), hypotheses=hyps) for name, hyps in
            (("good", good), ("bad", bad), ("same", list(good)), ("near", near))}
    pairs = [(name, runs[name], runs["good"]) for name in ("bad", "same", "near")]
    bleu, chrf = (compare(pairs, refs, 300, metric) for metric in ("bleu", "chrf"))
    for name in ("bad", "near"):
        assert bleu.per_seed_p[name] == pytest.approx(
            _two_sided_by_hand(runs[name].hypotheses, good, refs, 300))
    assert bleu.per_seed_p["bad"] < 0.05 and chrf.per_seed_p["bad"] < 0.05
    assert bleu.per_seed_p["same"] == 1.0 and bleu.per_seed_delta["same"] == 0
    assert bleu.per_seed_p["near"] > 0.05
    assert bleu.delta == pytest.approx(sum(bleu.per_seed_delta.values()) / 3)


def test_the_pooled_test_rejects_5_percent_of_true_nulls_not_10():
    """Calibration: pairs of systems of the same quality (each sentence's two hypotheses drawn
    from the same corruption), three seeds pooled, 400 times. The two-sided test rejects at
    α = 0.05 about 5 % of the time; sacrebleu's p (absolute differences centred) about twice
    as often."""
    rng = random.Random(7)
    words = "the a cat dog house big small red runs eats water bread and not very".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(120)]

    def system() -> list[str]:
        return [" ".join(w if rng.random() > 0.3 else rng.choice(words) for w in r.split())
                for r in refs]

    ours, theirs = [], []
    for _ in range(400):
        test = seed_paired_bootstrap([(system(), system()) for _ in range(3)], refs, 500)
        ours.append(test["p"] < 0.05)
        theirs.append(test["p_sacrebleu"] < 0.05)
    assert 0.025 <= np.mean(ours) <= 0.08
    assert np.mean(theirs) >= 1.5 * np.mean(ours)
    # the rates docs/verdicts.md quotes are this simulation's (it is seeded)
    quoted = f"rejects {100 * np.mean(ours):.1f} %, sacrebleu's {100 * np.mean(theirs):.1f} %"
    assert quoted in " ".join((REPO / "docs" / "verdicts.md").read_text().split())


def test_a_difference_of_zero_has_p_one():
    """Two different systems whose pooled difference is exactly 0 (each seed's pair swapped in
    the other): the two-sided p is 1; sacrebleu's would be about 0.4."""
    refs, good, bad = _corpus(6)
    test = seed_paired_bootstrap([(bad, good), (good, bad)], refs, n_samples=300)
    assert test["delta_bleu"] == 0 and test["p"] == 1.0


def test_mean_ci_against_hand_computation():
    values = [27.1, 27.9, 26.8]
    mean, half = mean_ci(values)
    # mean 27.2667, sample sd 0.568624, t(0.975, df=2) = 4.302653
    assert mean == pytest.approx(27.266667, abs=1e-5)
    assert half == pytest.approx(4.302653 * 0.568624 / math.sqrt(3), abs=1e-4)
    assert format_ci(mean, half) == "27.27 ± 1.41"
    m1, h1 = mean_ci([25.0])
    assert m1 == 25.0 and math.isnan(h1) and format_ci(m1, h1) == "25.00"
    _, h5 = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])  # t(0.975, 4) = 2.776445, sd = sqrt(2.5)
    assert h5 == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), abs=1e-5)


@pytest.mark.parametrize("arch,name,beam,lenpen", [
    ("transformer_twwt_wmt_en_de_big", "transformer_wmt", 4, 0.6),
    ("transformer_vaswani_wmt_en_de_big", "transformer_wmt", 4, 0.6),
    ("transformer_twwt_iwslt_de_en", "transformer_iwslt", 5, 1.0),
    ("transformer_dwt", "transformer_iwslt", 5, 1.0),
    ("dynamicconv_twwt_wmt_en_de_big", "dynamicconv_wmt", 5, 0.5),
    ("lightconv_iwslt_de_en", "dynamicconv_iwslt", 4, 1.0),
    ("dynamicconv_twwt", "dynamicconv_iwslt", 4, 1.0),
])
def test_auto_preset(arch, name, beam, lenpen):
    p = preset_for_arch(arch)
    assert (p.name, p.beam, p.lenpen) == (name, beam, lenpen)
    assert resolve_preset("auto", arch) == p
    assert resolve_preset("transformer_wmt", arch).beam == 4


def test_parse_hypotheses_restores_corpus_order_and_detects_gaps():
    text = "S-2\tc\nH-2\t-0.1\tC\nD-2\t-0.1\tC c\nD-0\t-0.2\tA a\nD-1\t-0.3\t\n"
    assert parse_hypotheses(text, 3) == ["A a", "", "C c"]
    with pytest.raises(RuntimeError, match="translated 3 of 4"):
        parse_hypotheses(text, 4)


def test_seed_paired_bootstrap_is_sacrebleus_test_for_one_seed():
    refs, good, bad = _corpus(2)
    mine = seed_paired_bootstrap([(bad, good)], refs, n_samples=300)
    theirs = _sacrebleu_paired(good, bad, refs, 300)
    assert mine["p_sacrebleu"] == pytest.approx(theirs["bleu_p"])
    assert mine["p"] == pytest.approx(_two_sided_by_hand(bad, good, refs, 300))
    assert mine["delta_bleu"] == pytest.approx(theirs["bleu"] - BLEU().corpus_score(
        good, [refs]).score)


def test_seed_paired_bootstrap_pools_seeds():
    refs, good, bad = _corpus(3)
    rng = random.Random(4)
    words = [w for r in refs for w in r.split()]
    good2, bad2 = ([" ".join(w if rng.random() > p else rng.choice(words) for w in r.split())
                    for r in refs] for p in (0.1, 0.4))
    near = [list(good), list(good2)]
    near[0][0], near[1][1] = bad[0], bad2[1]
    pooled = seed_paired_bootstrap([(bad, good), (bad2, good2)], refs, n_samples=300)
    singles = [seed_paired_bootstrap([pair], refs, n_samples=300)["delta_bleu"]
               for pair in ((bad, good), (bad2, good2))]
    assert pooled["delta_bleu"] == pytest.approx(sum(singles) / 2)
    assert pooled["p"] < 0.01 and pooled["n_seeds"] == 2
    same = seed_paired_bootstrap([(good, good), (good2, good2)], refs, n_samples=300)
    assert same["p"] == 1.0 and same["delta_bleu"] == 0
    close = seed_paired_bootstrap([(near[0], good), (near[1], good2)], refs, n_samples=300)
    assert close["p"] > 0.05


def test_the_resamples_are_sacrebleus_draws_and_their_bleu_is_sacrebleus():
    """Each resample's statistics are ``counts @ stats``: the counts are the sentences that
    sacrebleu's ``rng.choice(n, size=(B, n))`` draws (seed 12345), and the vectorized BLEU of
    every resample, and of rows where sacrebleu smooths or stops, is ``BLEU``'s own score."""
    refs, good, bad = _corpus(5)
    stats = metric_stats(bad, refs)
    idxs = np.random.default_rng(12345).choice(len(refs), size=(1200, len(refs)))
    counts = resample_counts(len(refs), 1200)
    assert counts.shape == (1200, len(refs)) and (counts.sum(1) == len(refs)).all()
    np.testing.assert_array_equal(counts @ stats.astype(np.float64), stats[idxs].sum(1))
    bleu = BLEU()
    rows = np.vstack([counts[:300] @ stats.astype(np.float64),
                      [[5, 7, 3, 1, 0, 0, 5, 4, 3, 2],  # no 3-gram match: exp smoothing
                       [3, 3, 2, 1, 0, 0, 3, 2, 1, 0],  # no 4-grams at all
                       [0, 4, 0, 0, 0, 0, 0, 0, 0, 0]]])  # an empty hypothesis
    want = [bleu._compute_score_from_stats(list(r)).score for r in rows]
    np.testing.assert_allclose(bleu_scores(rows), want, rtol=1e-12, atol=0)


def test_sweep_evaluation_args_are_evaluate_run_keywords():
    """A sweep's ``evaluation.args`` parse into options whose keywords are ``evaluate_run``'s
    (a language model's: ``evaluate_lm_run``'s); a flag the evaluation lacks is named."""
    opts = evaluate_options(["--average-last", "5", "--beam", "4", "--tag", "avg"])
    assert (opts.average_last, opts.beam, opts.tag, opts.subset) == (5, 4, "avg", "test")
    for fn, task in ((evaluate_run, "translation"), (evaluate_lm_run, "language_modeling")):
        params = inspect.signature(fn).parameters
        assert set(evaluate_options([], task).keywords()) == {
            k for k, p in params.items() if p.kind == p.KEYWORD_ONLY}
    assert evaluate_options(["--max-tokens", "99"], "language_modeling").max_tokens == 99
    with pytest.raises(ValueError, match="--tag"):
        evaluate_options(["--tag", "Best"])
    with pytest.raises(ValueError, match="evaluation.args: unrecognized arguments: --bogus"):
        evaluate_options(["--bogus"])


def test_the_vectorized_chrf_of_every_resample_is_sacrebleus():
    refs, good, bad = _corpus(8)
    bad = list(bad)
    bad[4] = ""  # no character n-grams on one side
    stats = metric_stats(bad, refs, "chrf")
    rows = resample_counts(len(refs), 400) @ stats.astype(np.float64)
    chrf = CHRF()
    want = [chrf._compute_score_from_stats(list(r)).score for r in rows]
    np.testing.assert_allclose(chrf_scores(rows), want, rtol=1e-12, atol=1e-12)
    assert chrf_scores(np.zeros((1, stats.shape[1])))[0] == 0.0


def test_what_seeds_can_show_matches_statsmodels_and_a_simulation():
    """The detectable Δ is statsmodels' t-test power solved for the effect (× sd); TOST's power
    at a true Δ of 0 is what 4,000 simulated seed sets give (their share that ``tost`` calls
    equivalent), and the seeds it needs are the first n reaching 80 %."""
    from statsmodels.stats.power import TTestPower

    for n in (3, 5, 10):
        effect = TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8)
        assert detectable(0.3, n) == pytest.approx(0.3 * effect, rel=1e-6)
    rng = np.random.default_rng(0)
    for n in (3, 5):
        sims = rng.normal(0, 0.3, size=(4000, n))
        share = np.mean([tost(list(x), 0.5)["p"] < 0.05 for x in sims])
        assert tost_power(0.3, n, 0.5) == pytest.approx(share, abs=0.02)
    need = seeds_for_equivalence(0.3, 0.5)
    assert tost_power(0.3, need, 0.5) >= 0.8 > tost_power(0.3, need - 1, 0.5)
    assert detectable(0.3, 1) == math.inf and seeds_for_equivalence(0.0, 0.5) == 2
