"""The numbers in docs/results.md are what the committed study records give."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from fairseq_tying.common.atomic import block_text
from fairseq_tying.core.scoring import PAPER_LAYERS as LAYERS  # the studies' grid
from fairseq_tying.launch.config import load_sweep
from fairseq_tying.launch.plateau import Plateau
from fairseq_tying.launch.studies import main as study
from fairseq_tying.studies import verdicts
from fairseq_tying.studies.formatting import format_p
from fairseq_tying.studies.records import training_summary
from fairseq_tying.studies.specs import study_claims
from fairseq_tying.studies.verdicts import bootstrap as verdict
from fairseq_tying.studies.view_grid import TYINGS, stop_correlation
from tests.helpers import REPO

DOCS = REPO / "docs"
RECORDS = DOCS / "study" / "records"


def test_the_study_covers_the_grid_with_three_seeds():
    records = [json.loads(p.read_text()) for p in RECORDS.glob("*.json")]
    cells = {(r["tying"], r["output_layer"], r["seed"]) for r in records}
    assert cells == {(t, la, s) for t in TYINGS for la in LAYERS for s in (1, 2, 3)}
    for r in records:
        assert r["train"]["valid"]["num_updates"] == 600 and r["checkpoint"] == "checkpoint_last.pt"
        assert (r["eval"]["beam"], r["eval"]["lenpen"], r["eval"]["n_sentences"]) == (5, 1.0, 1434)


def _rebuild(tmp_path: Path, name: str, folder: Path) -> tuple[Path, Path]:
    """``python -m fairseq_tying.launch study NAME --report-only`` into ``tmp_path``: the
    rebuilt docs/results.md (from one without the block) and the folder of the rebuilt
    summary.json."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("# Results\n")
    assert study([name, "--report-only", "--out", str(tmp_path)]) == 0
    return tmp_path / "docs" / "results.md", tmp_path / folder.relative_to(DOCS.parent)


@pytest.mark.slow
def test_rebuilding_from_the_records_reproduces_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(DOCS.parent)
    report, plots = _rebuild(tmp_path, "one_epoch", DOCS / "study")
    assert (plots / "summary.json").read_text() == (DOCS / "study" / "summary.json").read_text()
    assert block_text(report.read_text(), "study") == \
        block_text((DOCS / "results.md").read_text(), "study")


def test_the_one_epoch_verdicts_follow_from_its_records():
    """The claims table's verdicts for the one-epoch study (3 seeds): each per-seed difference
    is the difference of the two records' own sacrebleu scores, and the verdicts are the ones
    its prose argues (three-way tying loses BLEU after one epoch; l2norm gains on a three-way
    tied matrix; sqnorm's and cosine's gains do not survive Holm–Bonferroni over the study's
    claims, distance's is within the test set's noise)."""
    summary = json.loads((DOCS / "study" / "summary.json").read_text())
    bleu = {(r["tying"], r["output_layer"], r["seed"]): r["eval"]["bleu"]
            for r in (json.loads(p.read_text()) for p in RECORDS.glob("*.json"))}
    tests = {c.cell: (c, summary[c.cell][c.test]) for c in study_claims() if c.cell in summary}
    for cell, (claim, test) in tests.items():
        tying, layer = cell.split("/")
        base = ("none", layer) if claim.test == "vs_untied" else (tying, "dot")
        for seed, delta in test["per_seed_delta"].items():
            assert delta == pytest.approx(bleu[(tying, layer, int(seed))]
                                          - bleu[(*base, int(seed))], abs=1e-6)
    verdicts = {cell: verdict(test, claim.expects) for cell, (claim, test) in tests.items()}
    assert verdicts["three_way/dot"] == "contradicted"
    assert verdicts["three_way/l2norm"] == "supported"
    for layer in ("sqnorm", "cosine"):
        assert verdicts[f"three_way/{layer}"] == "unresolved (not significant after Holm)"
        assert tests[f"three_way/{layer}"][1]["p"] < 0.05  # supported on its raw p
    assert verdicts["three_way/distance"].startswith("unresolved")


GPU = DOCS / "converged_gpu" / "patience3"


def test_the_gpu_records_say_where_and_how_they_were_trained():
    records = [json.loads(p.read_text()) for p in (GPU / "records").glob("*.json")]
    assert len(records) == 7
    for r in records:
        assert r["train"]["device"] == "NVIDIA H100 80GB HBM3" and "--fp16" in r["train_args"]
        assert r["arch"] == "transformer_twwt_iwslt_de_en" and r["tying"] == "three_way"
        assert r["train"]["stop"]["reason"] in ("plateau", "cap")


def _assert_block_rebuilds(tmp_path: Path, folder: Path, block_name: str, name: str) -> None:
    """The report block and summary.json of study ``name``'s records (in ``folder``) are what
    the records give."""
    report, plots = _rebuild(tmp_path, name, folder)
    if any((folder / "records").glob("*.json")):
        assert (plots / "summary.json").read_text() == (folder / "summary.json").read_text()
    assert block_text(report.read_text(), block_name) == \
        block_text((DOCS / "results.md").read_text(), block_name)


@pytest.mark.slow
def test_rebuilding_the_gpu_block_from_its_records_reproduces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(DOCS.parent)
    _assert_block_rebuilds(tmp_path, GPU, "converged_gpu_patience3", "converged_gpu_patience3")


GPU_PATIENCE6 = DOCS / "converged_gpu"


def _train_nll_per_epoch(log: str) -> dict[int, float]:
    """fairseq's end-of-epoch ``train_nll_loss`` from a json-format training log."""
    out = {}
    for line in log.splitlines():
        if "| train |" in line:
            stats = json.loads(line[line.index("{"):])
            out[int(stats["epoch"])] = float(stats["train_nll_loss"])
    return out


def test_the_h200_baselines_follow_the_gpu_sweep_and_overfit(tmp_path):
    """The patience-6 GPU records: trained where and how the sweep says, stopped by its rule,
    their committed logs are the ones they were exported from, and (the report's finding)
    validation NLL rose from its best epoch to the stop while training NLL fell."""
    sweep = yaml.safe_load((DOCS.parent / "slurm" / "bible_converged_gpu.yaml").read_text())
    rule = Plateau(**sweep["stopping"])
    records = [json.loads(p.read_text()) for p in (GPU_PATIENCE6 / "records").glob("*.json")]
    assert sorted((r["tying"], r["output_layer"], r["seed"]) for r in records) == \
        [("decoder", "dot", 1), ("none", "dot", 1)]
    for r in records:
        assert r["train"]["device"] == "NVIDIA H200" and "--fp16" in r["train_args"]
        assert r["arch"] == "transformer_twwt_iwslt_de_en" and r["output_row_norms"] is None
        epochs = r["train"]["valid_epochs"]
        history = [{"epoch": e, "value": v} for e, _, v in epochs]
        assert rule.decide(history) == r["train"]["stop"]["reason"] == "plateau"
        assert all(rule.decide(history[:i]) is None for i in range(1, len(history)))
        log = gzip.decompress((GPU_PATIENCE6 / "logs" / f"{r['name']}.train.log.gz")
                              .read_bytes()).decode()
        (tmp_path / "train.log").write_text(log)
        assert training_summary(tmp_path / "train.log")["valid_history"] == \
            r["train"]["valid_history"]
        train = _train_nll_per_epoch(log)
        best, stop = min(epochs, key=lambda e: e[2]), epochs[-1]
        assert stop[2] > best[2] and train[stop[0]] < train[best[0]] - 0.4


@pytest.mark.slow
def test_rebuilding_the_patience6_gpu_block_from_its_records_reproduces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(DOCS.parent)
    _assert_block_rebuilds(tmp_path, GPU_PATIENCE6, "converged_gpu", "converged_gpu")

CONVERGED = DOCS / "converged"


def _committed_records(folder: Path, what: str) -> list[dict]:
    records = [json.loads(p.read_text()) for p in (folder / "records").glob("*.json")]
    if not records:
        pytest.skip(f"the {what} has no committed records yet")
    return records


def _valid_by_epoch(record: dict) -> dict[int, float]:
    """A record's validation NLL after each epoch."""
    return {e: v for e, _, v in record["train"]["valid_epochs"]}


def _converged_records() -> list[dict]:
    return _committed_records(CONVERGED, "converged study")


def test_converged_records_follow_the_protocol():
    """Each run stopped where the sweep's rule says, on the CPU, scored as the average of its
    last 5 epoch checkpoints (and its best one) with the paper's beam."""
    sweep = yaml.safe_load((DOCS.parent / "slurm" / "bible_converged.yaml").read_text())
    rule = Plateau(**sweep["stopping"])
    for r in _converged_records():
        stop, epochs = r["train"]["stop"], r["train"]["valid_epochs"]
        history = [{"epoch": e, "value": v} for e, _, v in epochs]
        assert all(rule.decide(history[:i]) is None for i in range(1, len(history)))
        assert rule.decide(history) == stop["reason"]
        assert epochs[-1][:2] == [stop["epoch"], stop["update"]]
        assert r["train"]["device"] == "cpu" and "--fp16" not in r["train_args"]
        last5 = [f"checkpoint{e}.pt" for e in range(stop["epoch"] - 4, stop["epoch"] + 1)]
        assert r["checkpoint"] == "checkpoint.avg5.pt" and r["eval"]["averaged"] == last5
        for ev in (r["eval"], r["eval_best"]):
            assert (ev["beam"], ev["lenpen"], ev["n_sentences"]) == (5, 1.0, 1434)


@pytest.mark.slow
def test_rebuilding_the_converged_block_from_its_records_reproduces_it(tmp_path, monkeypatch):
    _converged_records()
    monkeypatch.chdir(DOCS.parent)
    _assert_block_rebuilds(tmp_path, CONVERGED, "converged", "converged")


def test_converged_runs_are_compared_at_equal_training():
    """The report's equal-training table: each cell's validation NLL after the last epoch that
    every run reached, recomputed here from the records' per-epoch validation."""
    records = _converged_records()
    epoch = min(r["train"]["stop"]["epoch"] for r in records)
    summary = json.loads((CONVERGED / "summary.json").read_text())
    for r in records:
        cell = summary[f"{r['tying']}/{r['output_layer']}"]["valid_nll_common"]
        value = _valid_by_epoch(r)[epoch]
        assert cell["epoch"] == epoch and value in cell["values"]
    assert f"**Validation NLL after epoch {epoch}**" in (DOCS / "results.md").read_text()


def test_the_leads_converged_bullet_is_the_records():
    """Every number of the lead's bullet on the converged study follows from its records:
    how the runs stopped, each tying mode's BLEU and parameters, the Δs and the spread of
    stop epochs and BLEU between a cell's seeds."""
    records = _converged_records()
    summary = json.loads((CONVERGED / "summary.json").read_text())
    lead = " ".join((DOCS / "results.md").read_text()
                    .split("## The other studies")[1].split("\n- **")[1].split())
    stops = [r["train"]["stop"] for r in records]
    plateau = [s["epoch"] for s in stops if s["reason"] == "plateau"]
    (capped,) = [r for r in records if r["train"]["stop"]["reason"] != "plateau"]
    bleu = {t: summary[f"{t}/dot"] for t in ("none", "decoder", "three_way")}
    assert len(summary) == 7
    phrases = [f"(P1: {len(records)} runs, 3 seeds of each of its seven cells)",
               f"({len(plateau)} runs stopped at a plateau after {min(plateau)}–{max(plateau)} "
               f"epochs; three-way `{capped['output_layer']}`, seed {capped['seed']}, reached the "
               f"{capped['train']['stop']['epoch']})",
               f"**{bleu['none']['bleu']['mean']:.1f} BLEU untied** "
               f"({bleu['none']['params'][0] / 1e6:.1f}M parameters), "
               f"**{bleu['decoder']['bleu']['mean']:.1f} with decoder tying** "
               f"({bleu['decoder']['params'][0] / 1e6:.1f}M) and "
               f"**{bleu['three_way']['bleu']['mean']:.1f} with three-way tying** "
               f"({bleu['three_way']['params'][0] / 1e6:.1f}M)",
               f"{bleu['decoder']['vs_untied']['delta_bleu']:+.2f} and "
               f"{bleu['three_way']['vs_untied']['delta_bleu']:+.2f} over untied"]
    for t in ("decoder", "three_way"):
        test = bleu[t]["vs_untied"]
        assert max(test["per_seed_p"].values()) < 0.001 and min(test["per_seed_delta"].values()) > 0
    layers = {la: summary[f"three_way/{la}"]["vs_dot"] for la in ("l2norm", "cosine", "sqnorm",
                                                                   "distance")}
    phrases.append("`l2norm` is " + ", ".join(
        f"{'' if la == 'l2norm' else f'`{la}` '}{t['delta_bleu']:+.2f}".replace("-", "−")
        for la, t in layers.items() if la != "distance") +
        f" and `distance` {layers['distance']['delta_bleu']:+.2f}".replace("-", "−"))
    assert not any(verdicts.counts(t) for t in layers.values())
    assert all(len({np.sign(d) for d in t["per_seed_delta"].values()}) == 2
               for t in layers.values())  # "each with a seed that goes the other way"
    apart = max(max(c["stop"]["epochs"]) - min(c["stop"]["epochs"]) for c in summary.values())
    spread = max(max(c["bleu"]["values"]) - min(c["bleu"]["values"]) for c in summary.values())
    phrases.append(f"up to {apart} epochs and {spread:.1f} BLEU apart")
    common = min(s["epoch"] for s in stops)
    nll = {(r["tying"], r["output_layer"], r["seed"]):
           _valid_by_epoch(r)[common] for r in records}
    dot = {seed: nll["three_way", "dot", seed] for seed in (1, 2, 3)}
    ahead = [la for la in LAYERS[1:] if all(nll["three_way", la, s] < dot[s] for s in dot)]
    assert ahead == ["l2norm"]
    phrases.append(f"After epoch {common}, the last that every run reached, only `l2norm` is "
                   "ahead of `dot` in validation NLL in every seed")
    missing = [p for p in phrases if p not in lead]
    assert not missing, missing


def test_the_report_says_how_bleu_follows_training_length():
    """The correlation line of the converged block, recomputed here with numpy from each
    record's stop epoch and BLEU."""
    records = _converged_records()
    epochs = [r["train"]["stop"]["epoch"] for r in records]
    bleu = [r["eval"]["bleu"] for r in records]
    r = np.corrcoef(epochs, bleu)[0, 1]
    assert (f"over the {len(records)} runs, test BLEU against the epoch at which the run stopped "
            f"has Pearson r = {r:.2f}") in (DOCS / "results.md").read_text()


def test_the_correlation_needs_three_runs_at_different_epochs():
    def cell(epochs: list[int], bleu: list[float]) -> dict:
        return {"stop": {"epochs": epochs}, "bleu": {"values": bleu}}

    assert stop_correlation({"a": cell([20, 21], [28.0, 29.0])}) is None
    assert stop_correlation({"a": cell([20, 20], [28.0, 29.0]), "b": cell([20], [27.0])}) is None
    r, _p, n = stop_correlation({"a": cell([20, 30], [28.0, 30.0]), "b": cell([25], [28.5])})
    assert n == 3 and r == pytest.approx(np.corrcoef([20, 30, 25], [28.0, 30.0, 28.5])[0, 1])


EQUAL = DOCS / "equal"


def _equal_records() -> list[dict]:
    return _committed_records(EQUAL, "equal-training study")


def _equal_epoch() -> int:
    sweep = yaml.safe_load((DOCS.parent / "slurm" / "bible_equal.yaml").read_text())
    return sweep["stopping"]["max_epoch"]


def test_the_equal_training_budget_is_the_longest_plateau_of_p1():
    """Every equal-training run trains as long as the longest run of the converged P1, so
    none is cut short of the training some plateau run had."""
    stops = [r["train"]["stop"]["epoch"] for r in _converged_records()]
    assert len(stops) == 21 and _equal_epoch() == max(stops) == 40


def test_equal_training_records_trained_their_budget():
    """Each run trained exactly the budget, validated every epoch once, and is scored on its
    last 5 epoch checkpoints."""
    last = _equal_epoch()
    for r in _equal_records():
        assert r["train"]["stop"]["epoch"] == last and r["train"]["stop"]["reason"] == "budget"
        assert [e for e, _, _ in r["train"]["valid_epochs"]] == list(range(1, last + 1))
        last5 = [f"checkpoint{e}.pt" for e in range(last - 4, last + 1)]
        assert r["checkpoint"] == "checkpoint.avg5.pt" and r["eval"]["averaged"] == last5


def _equal_lead() -> str:
    """docs/results.md's section "The verdicts at equal training", without its heading."""
    text = (DOCS / "results.md").read_text()
    return text.split("## The verdicts at equal training")[1].split("\n## ")[0]


def test_the_lead_counts_each_blocks_runs_as_the_records_do():
    """The verdicts' lead names each block of the equal-training study (E1: priority 1 of the
    sweep …) as "complete" or "N of M runs in", and N and M are the committed records' and the
    sweep's counts."""
    sweep = load_sweep(DOCS.parent / "slurm" / "bible_equal.yaml", check_data=False)
    recorded = {r["name"] for r in _equal_records()}
    labels = re.findall(r"\((E\d), (complete|\d+ of \d+ runs in)\)", _equal_lead())
    assert labels
    for block, label in labels:
        runs = [r.name for r in sweep.runs if r.priority == int(block[1:])]
        n = sum(name in recorded for name in runs)
        assert label == ("complete" if n == len(runs) else f"{n} of {len(runs)} runs in"), block


def _signed(x: float) -> str:
    """A difference as the lead writes it: a sign always, a true minus."""
    return f"{x:+.2f}".replace("-", "−")


def _nll_by_seed(arch: str, tying: str, layer: str) -> dict[int, dict[int, float]]:
    return {r["seed"]: _valid_by_epoch(r) for r in _equal_records()
            if (r["arch"], r["tying"], r["output_layer"]) == (arch, tying, layer)}


def _sides(arch: str, a: tuple[str, str], b: tuple[str, str]) -> tuple[set[int], set[int]]:
    """The epochs in which cell ``a``'s (tying, layer) validation NLL is below cell ``b``'s in
    every seed, and those in which it is above it in every seed."""
    ha, hb = _nll_by_seed(arch, *a), _nll_by_seed(arch, *b)
    assert ha.keys() == hb.keys(), (a, b)
    epochs = set.intersection(*(set(h) for h in [*ha.values(), *hb.values()]))
    return ({e for e in epochs if all(ha[s][e] < hb[s][e] for s in ha)},
            {e for e in epochs if all(ha[s][e] > hb[s][e] for s in ha)})


def _longest_run(epochs: set[int]) -> int:
    """The most consecutive epochs in ``epochs``."""
    return max((next(n for n in range(1, len(epochs) + 2) if e + n not in epochs)
                for e in epochs if e - 1 not in epochs), default=0)


def _run_from(epochs: set[int], last: int) -> int:
    """The first epoch of the run in ``epochs`` that lasts to ``last``."""
    assert last in epochs, "the prose says 'to the last'"
    return next(e for e in range(last, 0, -1) if e - 1 not in epochs)


def _run_to(epochs: set[int]) -> int:
    """The last epoch of the run in ``epochs`` that starts at epoch 1 (0 if there is none)."""
    return next(e for e in range(0, max(epochs, default=0) + 1) if e + 1 not in epochs)


def test_the_leads_numbers_are_the_records():
    """Every number of the lead's E1 and E2 verdicts follows from the committed records (the
    block's summary.json for the paired tests, the records for the epochs and seeds)."""
    lead = " ".join(_equal_lead().split())
    summary = json.loads((EQUAL / "summary.json").read_text())
    tr, dc = summary["transformer_twwt"], summary["dynamicconv_twwt"]
    l2, sq = tr["three_way/l2norm"]["vs_dot"], tr["three_way/sqnorm"]["vs_dot"]
    dot = ("three_way", "dot")
    l2_from = _run_from(_sides("transformer_twwt", ("three_way", "l2norm"), dot)[0],
                        _equal_epoch())
    phrases = [f"by {_signed(l2['delta_bleu'])} BLEU (p = {l2['p']:.3f}",
               f"below `dot`'s in every seed from epoch {l2_from} to {_equal_epoch()}",
               f"`sqnorm`'s {_signed(sq['delta_bleu'])} (p = {sq['p']:.3f}, every seed) does not "
               f"survive Holm–Bonferroni over the study's claims (adjusted p = "
               f"{sq['p_holm']:.3f})"]
    phrases += [f"`{la}` ({_signed(tr[f'three_way/{la}']['vs_dot']['delta_bleu'])})"
                for la in ("distance", "cosine")]
    for la in ("sqnorm", "distance", "cosine"):  # "no layer but l2norm … more than two epochs"
        assert _longest_run(set.union(*_sides("transformer_twwt", ("three_way", la), dot))) <= 2, la
    spread = {c: max(v["bleu"]["values"]) - min(v["bleu"]["values"])
              for c, v in tr.items() if c.startswith("three_way/")}
    widest = max(spread, key=spread.get)
    lo, hi = sorted(tr[widest]["bleu"]["values"])[::2]
    phrases.append(f"at most {spread[widest]:.2f} BLEU apart (`{widest.split('/')[1]}`: "
                   f"{lo:.2f}–{hi:.2f})")
    dl2 = dc["three_way/l2norm"]["vs_dot"]
    seeds = ", ".join(_signed(d) for d in dl2["per_seed_delta"].values())
    phrases.append(f"{_signed(dl2['delta_bleu'])} BLEU (p = {dl2['p']:.3f}; seeds {seeds})")
    a = _nll_by_seed("dynamicconv_twwt", "three_way", "l2norm")
    b = _nll_by_seed("dynamicconv_twwt", "three_way", "dot")
    above = [a[s][e] > b[s][e] for s in a for e in a[s]]
    phrases.append(f"*above* `dot`'s in {sum(above)} of the {len(above)} seed-epochs")
    for model, cell in (("DynamicConv", dc["three_way/dot"]), ("Transformer", tr["three_way/dot"])):
        v = cell["bleu"]["values"]
        phrases.append(f"{cell['bleu']['mean']:.2f}" + (" BLEU with `dot` (seeds " if
                       model == "DynamicConv" else " (") + f"{min(v):.2f}–{max(v):.2f}, "
                       f"{cell['params'][0] / 1e6:.2f}M")
    missing = [p for p in phrases if p not in lead]
    assert not missing, missing



def test_the_leads_tying_numbers_are_the_records():
    """The lead's E3 bullet: each tying mode's BLEU and parameters and each tied mode's paired Δ
    over untied with its p, for the seeds the untied and decoder-tied cells have in common."""
    lead = " ".join(_equal_lead().split())
    tr = json.loads((EQUAL / "summary.json").read_text())["transformer_twwt"]
    seeds = set(tr["none/dot"]["seeds"]) & set(tr["decoder/dot"]["seeds"])
    assert seeds and seeds <= set(tr["three_way/dot"]["seeds"])
    phrases = []
    for tying in ("none", "decoder", "three_way"):
        cell = tr[f"{tying}/dot"]
        bleu = [b for s, b in zip(cell["seeds"], cell["bleu"]["values"], strict=True) if s in seeds]
        phrases += [f"{np.mean(bleu):.2f}", f"{cell['params'][0] / 1e6:.2f}M"]
        if tying != "none":
            test = cell["vs_untied"]
            assert test["n_seeds"] == len(seeds)
        if tying != "none" and len(seeds) < verdicts.SEEDS:  # complete: _tying_verdict_phrases
            phrases.append(f"{_signed(test['delta_bleu'])}" + (" over untied" if tying ==
                           "decoder" else "") + f", {format_p(test['p'])}")
    if len(seeds) < verdicts.SEEDS:
        phrases.append("in seed 1," if seeds == {1} else
                       f"in seeds {' and '.join(map(str, sorted(seeds)))},")
        phrases.append("there is no verdict")
    else:
        phrases += _tying_verdict_phrases(lead, tr)
    missing = [p for p in phrases if p not in lead]
    assert not missing, missing


def _tying_verdict_phrases(lead: str, tr: dict) -> list[str]:
    """With every seed in: the E3 headline's verdict for each tied mode is the bootstrap rule's
    (``verdicts.in_words``); each Δ says "better in every seed" only when every seed's Δ is
    positive (else it lists them); the epoch from which each tied mode's validation NLL stays
    below untied's in every seed, and the first epochs in which it is above in every seed; and
    the converged study's Δ it is set against."""
    head = re.search(r"\*\*Tying \(E3, complete\): (.*?)\*\*", lead)
    assert head, "the E3 bullet has no complete headline"
    tests = {t: tr[f"{t}/dot"]["vs_untied"] for t in ("decoder", "three_way")}
    words = {t: verdicts.in_words(test) for t, test in tests.items()}
    verb = {"better": "beats untied", "worse": "is worse than untied",
            "no difference shown": "does not beat untied by the rule"}
    assert head[1] == ("decoder tying and three-way tying both beat untied"
                       if set(words.values()) == {"better"} else
                       f"decoder tying {verb[words['decoder']]}, three-way tying "
                       f"{verb[words['three_way']]}")
    phrases, start, first = [], {}, {}
    for tying, test in tests.items():
        deltas = list(test["per_seed_delta"].values())
        every = ("better in every seed" if min(deltas) > 0 else
                 "seeds " + ", ".join(_signed(d) for d in deltas))
        phrases.append(f"{_signed(test['delta_bleu'])}" + " BLEU" * (tying == "decoder") +
                       f" ({format_p(test['p'])}, {every})")
        below, above = _sides("transformer_twwt", (tying, "dot"), ("none", "dot"))
        start[tying], first[tying] = _run_from(below, _equal_epoch()), _run_to(above)
    if min(first.values()) > 0:
        phrases.append(f"for the first {first['decoder']} (decoder) and {first['three_way']} "
                       f"(three-way) epochs and below it from epochs {start['decoder']} and "
                       f"{start['three_way']} to the last")
    else:
        phrases.append(f"from epoch {start['decoder']} (decoder) and {start['three_way']} "
                       "(three-way) to the last")
    converged = json.loads((CONVERGED / "summary.json").read_text())
    gains = [converged[f"{t}/dot"]["vs_untied"]["delta_bleu"] for t in tests]
    phrases.append("put the gains at " + " and ".join(map(_signed, gains)))
    return phrases


def test_the_equal_studys_cost_follows_its_timings():
    """The study's cost in results.md and in the README's table of tools is the range of the
    minutes an epoch its cost table measured, times its runs' epochs (DynamicConv at its
    measured ratio), two runs at a time."""
    text = (DOCS / "results.md").read_text()
    table = text.split("| CPU | runs | epochs timed | minutes an epoch |")[1].split("\n\n")[0]
    minutes = [float(m) for row in table.splitlines()[2:] if row.split("|")[2].strip()[0] == "E"
               for m in row.split("|")[4].split("/")]
    lo, hi = min(minutes), max(minutes)
    ratio = float(re.search(r"it is (\d\.\d+)×", text)[1])
    hours = [round((21 + 6 * ratio) * _equal_epoch() * m / 2 / 60) for m in (lo, hi)]
    e2 = [round(6 * ratio * _equal_epoch() * m / 2 / 60) for m in (lo, hi)]
    prose = " ".join(text.split())
    assert (f"(21 + 6 × {ratio:.2f}) × 40 × ({lo:.2f} to {hi:.2f}) ÷ 2 minutes, "
            f"**{hours[0]} to {hours[1]} hours of the 2 cores**") in prose
    assert f"E2's six runs {e2[0]} to {e2[1]} of them" in prose
    cpus = {row.split("|")[1].strip() for row in table.splitlines()[2:]}
    words = {2: "two", 3: "three", 4: "four"}[len(cpus)]
    readme = (DOCS.parent / "README.md").read_text()
    assert (f"({hours[0]}–{hours[1]} h of the 2 cores: {lo:.2f}–{hi:.2f} min an epoch per run, "
            f"two side by side, as measured on {words} CPUs)") in readme


@pytest.mark.slow
def test_rebuilding_the_equal_training_block_from_its_records_reproduces_it(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(DOCS.parent)  # with no record yet, the block is the count of records
    _assert_block_rebuilds(tmp_path, EQUAL, "equal", "equal")


FP16 = DOCS / "converged_fp16"
P1_CELLS = list(dict.fromkeys(  # (tying, output layer) of P1, in the sweep's order
    (r.tying, r.output_layer) for r in load_sweep(DOCS.parent / "slurm" / "bible_converged.yaml",
                                                  check_data=False).runs if r.priority == 1))


def _fp16_epochs(name: str) -> list[dict]:
    return json.loads((FP16 / "valid_history" / f"{name}.json").read_text())["epochs"]


def _fp16_history(tying: str, layer: str, seed: int) -> dict[int, float]:
    return {e["epoch"]: e["value"]
            for e in _fp16_epochs(f"bible.transformer_twwt.{tying}.{layer}.s{seed}")}


def _nll_cell(values: list[float | None]) -> str:
    if None in values:
        return " / ".join("–" if v is None else f"{v:.3f}" for v in values)
    return f"**{np.mean(values):.3f}** ({' / '.join(f'{v:.3f}' for v in values)})"


def test_the_fp16_table_is_the_runs_validation_histories():
    """docs/results.md's fp16 table: validation NLL after epochs 18 and 24 of the 14 fp16 runs
    on the H200 (committed valid_history.json) beside the CPU runs of the same cell and seed
    (their records; '–' where the CPU run had stopped)."""
    cpu = {(r["tying"], r["output_layer"], r["seed"]): {e: v for e, _, v in
                                                        r["train"]["valid_epochs"]}
           for r in _converged_records()}
    rows = []
    for tying, layer in P1_CELLS:
        gpu = [_fp16_history(tying, layer, s) for s in (1, 2)]
        ref = [cpu[(tying, layer, s)] for s in (1, 2)]
        cells = [[h.get(e) for h in hs] for e in (18, 24) for hs in (gpu, ref)]
        rows.append(f"| {tying} × {layer} | " + " | ".join(_nll_cell(c) for c in cells) + " |")
    assert "\n".join(rows) in (DOCS / "results.md").read_text()


def test_the_fp16_runs_trained_as_the_sweep_says_and_no_plateau_came_by_epoch_24(tmp_path):
    """Each committed fp16 run trained 24 epochs with the sweep's command (fp16's loss scale in
    its log) and its log's validation history is the committed one; the CPU study's rule had
    not stopped any of them, while it stopped 9 of their 14 CPU twins by epoch 21."""
    sweep = yaml.safe_load((DOCS.parent / "slurm" / "bible_converged.yaml").read_text())
    rule = Plateau(**sweep["stopping"])
    cpu_stops = {(r["tying"], r["output_layer"], r["seed"]): r["train"]["stop"]["epoch"]
                 for r in _converged_records()}
    for tying, layer in P1_CELLS:
        for seed in (1, 2):
            name = f"bible.transformer_twwt.{tying}.{layer}.s{seed}"
            history = _fp16_epochs(name)
            assert [h["epoch"] for h in history] == list(range(1, 25))
            assert all(rule.decide(history[:i]) is None for i in range(1, 25))
            log = gzip.decompress((FP16 / "logs" / f"{name}.train.log.gz").read_bytes()).decode()
            assert '"loss_scale"' in log and "'fp16': True" in log
            (tmp_path / "train.log").write_text(log)
            logged = training_summary(tmp_path / "train.log")["valid_history"]
            assert [[h["update"], h["value"]] for h in history] == logged
    assert sum(cpu_stops[(t, la, s)] <= 21 for t, la in P1_CELLS for s in (1, 2)) == 9
