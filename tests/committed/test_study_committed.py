"""The committed study records and the blocks rebuilt from them: each study block of
docs/results*.md is what ``python -m fairseq_tying.launch study NAME
--report-only`` writes from the records alone, each paired test in summary.json is the records'
own scores, and each record is what its study's protocol says (stop, scoring, device, logs)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from fairseq_tying.common.blocks import markers
from fairseq_tying.core.output_layers import PAPER_LAYERS as LAYERS  # the studies' grid
from fairseq_tying.launch.studies import main as study
from fairseq_tying.studies.engine.specs import claim_family_size
from fairseq_tying.studies.records import records as study_records
from fairseq_tying.studies.records.record import Record
from fairseq_tying.studies.records.records import training_summary
from fairseq_tying.studies.statistics.verdicts import holm, resamples
from fairseq_tying.studies.views.view_grid import TYINGS
from fairseq_tying.sweeps.config import load_sweep
from fairseq_tying.sweeps.plateau import Plateau
from tests.helpers import REPO

DOCS = REPO / "docs"
GPU, GPU_PATIENCE3 = DOCS / "converged_gpu", DOCS / "converged_gpu" / "patience3"
BLOCKS = {  # study: (page, block, folder of its records and summary.json)
    "one_epoch": ("results_one_epoch.md", "study", DOCS / "study"),
    "converged": ("results_converged.md", "converged", DOCS / "converged"),
    "equal": ("results.md", "equal", DOCS / "equal"),
    "equal_primary": ("results.md", "answer", DOCS / "equal" / "primary"),
    "converged_gpu": ("results_gpu.md", "converged_gpu", GPU),
    "converged_gpu_patience3": ("results_gpu.md", "converged_gpu_patience3", GPU_PATIENCE3),
}


def _records(folder: Path) -> list[Record]:
    return study_records.load(folder / "records", hypotheses=False)


def _sweep_rule(name: str) -> Plateau:
    return Plateau(**yaml.safe_load((REPO / "slurm" / name).read_text())["stopping"])


def _valid_by_epoch(record: Record) -> dict[int, float]:
    return {e: v for e, _, v in record.train.valid_epochs}


@pytest.mark.slow
@pytest.mark.parametrize("name", BLOCKS)
def test_rebuilding_a_block_from_its_records_reproduces_it(name, tmp_path, monkeypatch):
    """Into a copy of the page whose block is emptied, the study command writes the page back
    byte for byte, and the study's summary.json."""
    page, block, folder = BLOCKS[name]
    text = (DOCS / page).read_text()
    begin, end = markers(block)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / page).write_text(text[:text.index(begin)] + f"{begin}\nold\n"
                                          + text[text.index(end):])
    monkeypatch.chdir(REPO)
    assert study([name, "--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / page).read_text() == text
    assert (tmp_path / folder.relative_to(REPO) / "summary.json").read_text() == \
        (folder / "summary.json").read_text()


@pytest.mark.parametrize("name", ["one_epoch", "converged", "equal"])
def test_each_paired_test_is_the_records_scores_and_holm_over_the_claims(name):
    """Each per-seed Δ of summary.json is the difference of the two records' own sacrebleu
    scores (a cell against `dot` with its tying, or against untied with its layer); each tying
    claim's equivalence test is TOST within ±0.5 of those differences (scipy's one-sided
    t-tests); the Holm-adjusted p of the study's tests is Holm over exactly the claims' raw p
    and the equivalence tests'; and the bootstrap drew B ≥ 20·m/α resamples for those m
    tests, m counted from the records' cells before any comparison."""
    folder = BLOCKS[name][2]
    summary = json.loads((folder / "summary.json").read_text())
    sections = summary if name == "equal" else {"transformer_twwt": summary}
    records = _records(folder)
    bleu = {(r.run.arch, r.run.tying, r.run.output_layer, r.run.seed): r.eval.bleu
            for r in records}
    family = []
    for arch, cells in sections.items():
        for cell in cells.values():
            tying, layer = cell["tying"], cell["output_layer"]
            for key, base in (("vs_dot", (tying, "dot")), ("vs_untied", ("none", layer))):
                test = cell.get(key)
                if not isinstance(test, dict) or "per_seed_delta" not in test:
                    continue
                family += [test] if "p_holm" in test else []
                deltas = [bleu[(arch, tying, layer, int(seed))] - bleu[(arch, *base, int(seed))]
                          for seed in test["per_seed_delta"]]
                assert list(test["per_seed_delta"].values()) == pytest.approx(deltas, abs=1e-6)
                if (eq := test.get("equivalence")) is not None:
                    assert key == "vs_untied" and layer == "dot" and eq["margin"] == 0.5
                    family.append(eq)
                    lower = stats.ttest_1samp(deltas, -0.5, alternative="greater").pvalue
                    upper = stats.ttest_1samp(deltas, 0.5, alternative="less").pvalue
                    assert eq["p"] == pytest.approx(max(lower, upper), rel=1e-6)
    m = len(family)
    assert family and {t["family"] for t in family} == {m}
    assert [t["p_holm"] for t in family] == pytest.approx(holm([t["p"] for t in family]))
    by_arch: dict = {}
    for r in records:
        by_arch.setdefault(r.run.arch, {}).setdefault((r.run.tying, r.run.output_layer),
                                                      {})[r.run.seed] = r
    assert claim_family_size(list(by_arch.values())) == m
    samples = {t["n_samples"] for t in family if "n_samples" in t}
    assert samples == {resamples(m)} and m / (resamples(m) + 1) <= 0.05 / 20


def test_every_cell_is_checked_for_learning_at_its_budget_from_its_records():
    """Each cell's convergence check in the equal study's summary.json is its runs' validation
    NLL written out: per seed, (best of epochs 1–37 − best of 38–40) / best of 1–37; a cell
    still learns when their mean is 0.5 % or more, and its comparisons say so (cosine's at 40
    epochs: +0.4, +0.5, +0.6 %)."""
    summary = json.loads((DOCS / "equal" / "summary.json").read_text())
    nll = {(r.run.arch, r.run.tying, r.run.output_layer, r.run.seed):
           [v for _, _, v in r.train.valid_epochs] for r in _records(DOCS / "equal")}
    still = set()
    for arch, cells in summary.items():
        for label, cell in cells.items():
            want = [(min(v[:-3]) - min(v[-3:])) / min(v[:-3]) for v in (
                nll[(arch, cell["tying"], cell["output_layer"], seed)] for seed in cell["seeds"])]
            assert cell["learning"] == {"gains": pytest.approx(want), "window": 3,
                                        "threshold": 0.005}
            if sum(want) / len(want) >= 0.005:
                still.add((arch, label))
            for key in ("vs_dot", "vs_untied"):
                if isinstance(test := cell.get(key), dict) and "per_seed_delta" in test:
                    assert (label in test.get("learning", ())) == ((arch, label) in still)
    assert still == {("transformer_twwt", "three_way/cosine")}


def test_the_one_epoch_study_covers_its_grid_after_600_updates():
    records = _records(DOCS / "study")
    cells = {(r.run.tying, r.run.output_layer, r.run.seed) for r in records}
    assert cells == {(t, la, s) for t in TYINGS for la in LAYERS for s in (1, 2, 3)}
    for r in records:
        assert r.train.valid["num_updates"] == 600 and r.checkpoint == "checkpoint_last.pt"
        assert (r.eval.beam, r.eval.lenpen, r.eval.n_sentences) == (5, 1.0, 1434)


def test_converged_records_follow_the_protocol():
    """Each run stopped where the sweep's rule says, on the CPU, scored as the average of its
    last 5 epoch checkpoints (and its best one) with the paper's beam; the block's table at
    equal training is each run's validation NLL after the last epoch every run reached."""
    rule, records = _sweep_rule("bible_converged.yaml"), _records(DOCS / "converged")
    for r in records:
        stop, epochs = r.train.stop, r.train.valid_epochs
        history = [{"epoch": e, "value": v} for e, _, v in epochs]
        assert all(rule.decide(history[:i]) is None for i in range(1, len(history)))
        assert rule.decide(history) == stop.reason
        assert epochs[-1][:2] == [stop.epoch, stop.update]
        assert r.train.device == "cpu" and "--fp16" not in r.run.train_args
        last5 = [f"checkpoint{e}.pt" for e in range(stop.epoch - 4, stop.epoch + 1)]
        assert r.checkpoint == "checkpoint.avg5.pt" and r.eval.averaged == last5
        for ev in (r.eval, r.eval_best):
            assert (ev.beam, ev.lenpen, ev.n_sentences) == (5, 1.0, 1434)
    epoch = min(r.train.stop.epoch for r in records)
    summary = json.loads((DOCS / "converged" / "summary.json").read_text())
    for r in records:
        common = summary[f"{r.run.tying}/{r.run.output_layer}"]["valid_nll_common"]
        assert common["epoch"] == epoch and _valid_by_epoch(r)[epoch] in common["values"]
    r = np.corrcoef([x.train.stop.epoch for x in records], [x.eval.bleu for x in records])[0, 1]
    assert (f"over the {len(records)} runs, test BLEU against the epoch at which the run stopped "
            f"has Pearson r = {r:.2f}") in (DOCS / "results_converged.md").read_text()


def test_equal_training_records_trained_the_longest_plateau_run_of_p1():
    """The budget is the longest converged P1 run; every run trained exactly that, validated
    every epoch once, and is scored on its last 5 epoch checkpoints."""
    last = yaml.safe_load((REPO / "slurm" / "bible_equal.yaml").read_text())["stopping"]
    last = last["max_epoch"]
    stops = [r.train.stop.epoch for r in _records(DOCS / "converged")]
    assert len(stops) == 21 and last == max(stops) == 40
    for r in _records(DOCS / "equal"):
        assert r.train.stop.epoch == last and r.train.stop.reason == "budget"
        assert [e for e, _, _ in r.train.valid_epochs] == list(range(1, last + 1))
        last5 = [f"checkpoint{e}.pt" for e in range(last - 4, last + 1)]
        assert r.checkpoint == "checkpoint.avg5.pt" and r.eval.averaged == last5


def test_the_gpu_records_say_where_and_how_they_were_trained(tmp_path):
    """Patience 3: seven H100 runs. Patience 6: the two H200 baselines, stopped by the sweep's
    rule, exported from their committed logs; and (results_gpu.md) both overfit: validation NLL
    rose from its best epoch to the stop while training NLL fell, and their BLEU is less than
    half the CPU study's with the same tying, layer and seed."""
    cpu = {(r.run.tying, r.run.output_layer, r.run.seed): r for r in _records(DOCS / "converged")}
    for r in _records(GPU_PATIENCE3):
        assert r.train.device == "NVIDIA H100 80GB HBM3" and "--fp16" in r.run.train_args
        assert r.run.arch == "transformer_twwt_iwslt_de_en" and r.run.tying == "three_way"
        assert r.train.stop.reason in ("plateau", "cap")
    assert len(_records(GPU_PATIENCE3)) == 7
    rule, records = _sweep_rule("bible_converged_gpu.yaml"), _records(GPU)
    assert sorted((r.run.tying, r.run.output_layer, r.run.seed) for r in records) == \
        [("decoder", "dot", 1), ("none", "dot", 1)]
    for r in records:
        assert r.train.device == "NVIDIA H200" and "--fp16" in r.run.train_args
        assert r.run.arch == "transformer_twwt_iwslt_de_en" and r.output_row_norms is None
        epochs = r.train.valid_epochs
        history = [{"epoch": e, "value": v} for e, _, v in epochs]
        assert rule.decide(history) == r.train.stop.reason == "plateau"
        assert all(rule.decide(history[:i]) is None for i in range(1, len(history)))
        log = gzip.decompress((GPU / "logs" / f"{r.name}.train.log.gz").read_bytes()).decode()
        (tmp_path / "train.log").write_text(log)
        assert training_summary(tmp_path / "train.log").valid_history == r.train.valid_history
        train = {int(s["epoch"]): float(s["train_nll_loss"]) for s in
                 (json.loads(line[line.index("{"):]) for line in log.splitlines()
                  if "| train |" in line)}
        best, stop = min(epochs, key=lambda e: e[2]), epochs[-1]
        assert stop[2] > best[2] and train[stop[0]] < train[best[0]]
        assert r.eval.bleu < cpu[r.run.tying, r.run.output_layer, r.run.seed].eval.bleu / 2


def test_the_fp16_runs_are_their_logs_and_rank_as_results_gpu_says(tmp_path):
    """Each fp16 run of the CPU study's model trained 24 epochs with fp16's loss scale, its
    committed history is its log's, and the plateau rule stopped none. After epoch 18, on both
    devices (mean of seeds 1 and 2), `l2norm` leads the three-way-tied layers and untied is
    last; the CPU rule had stopped most of the CPU twins by epoch 24."""
    rule = _sweep_rule("bible_converged.yaml")
    cpu = {(r.run.tying, r.run.output_layer, r.run.seed): r for r in _records(DOCS / "converged")}
    sweep = load_sweep(REPO / "slurm" / "bible_converged.yaml", check_data=False)
    cells = list(dict.fromkeys((r.identity.tying, r.identity.output_layer) for r in sweep.runs
                               if r.priority == 1))
    fp16, ref = {}, {}
    for tying, layer in cells:
        for seed in (1, 2):
            name = f"bible.transformer_twwt.{tying}.{layer}.s{seed}"
            history = json.loads((DOCS / "converged_fp16" / "valid_history" / f"{name}.json")
                                 .read_text())["epochs"]
            assert [h["epoch"] for h in history] == list(range(1, 25))
            assert all(rule.decide(history[:i]) is None for i in range(1, 25))
            log = gzip.decompress((DOCS / "converged_fp16" / "logs" / f"{name}.train.log.gz")
                                  .read_bytes()).decode()
            assert '"loss_scale"' in log and "'fp16': True" in log
            (tmp_path / "train.log").write_text(log)
            logged = training_summary(tmp_path / "train.log").valid_history
            assert [[h["update"], h["value"]] for h in history] == logged
            fp16.setdefault((tying, layer), []).append(history[17]["value"])
            ref.setdefault((tying, layer), []).append(_valid_by_epoch(cpu[tying, layer, seed])[18])
    for means in ({c: np.mean(v) for c, v in d.items()} for d in (fp16, ref)):
        assert max(means, key=means.get) == ("none", "dot")
        assert min((c for c in means if c[0] == "three_way"), key=means.get)[1] == "l2norm"
    stopped = [cpu[c + (s,)].train.stop.epoch <= 24 for c in cells for s in (1, 2)]
    assert sum(stopped) > len(stopped) / 2


@pytest.mark.parametrize("page, block", [(REPO / "README.md", "does_it_help"),
                                         (DOCS / "results.md", "answer")])
def test_no_answer_row_calls_seeds_that_disagree_the_test_sets_noise(page, block):
    """Each verdict of the answer table against the paired tests of summary.json, re-derived
    here by hand: "within the test set's noise" only where the pooled p ≥ 0.05 and no two seeds
    are significant on their own with opposite signs; "seeds disagree" exactly where they are."""
    summary = json.loads((DOCS / "equal" / "primary" / "summary.json").read_text())
    begin, end = markers(block)
    text = page.read_text()
    rows = [line.split(" | ") for line in text[text.index(begin):text.index(end)].splitlines()
            if line.startswith("| `")]
    assert len(rows) == sum(len(cells) for cells in summary.values())
    for row in rows:
        arch, tying, layer, verdict = row[0][2:].strip("`"), row[1], row[2].strip("`"), row[-1]
        if verdict.startswith("baseline"):
            continue
        test = summary[arch][f"{tying}/{layer}"]["vs_untied" if "untied" in row[5] else "vs_dot"]
        signs = {test["per_seed_delta"][s] > 0 for s, p in test["per_seed_p"].items() if p < 0.05}
        noise = "within the test set's noise" in verdict
        assert ("seeds disagree" in verdict) == (len(signs) == 2 and test["n_seeds"] >= 3), row
        assert not noise or (len(signs) < 2 and test["p"] >= 0.05), row


def _answer_rows(page: Path, block: str) -> list[list[str]]:
    begin, end = markers(block)
    text = page.read_text()
    return [[c.strip() for c in line.strip("|").split(" | ")]
            for line in text[text.index(begin):text.index(end)].splitlines()
            if line.startswith("| `")]


@pytest.mark.parametrize("page, block", [(REPO / "README.md", "does_it_help"),
                                         (DOCS / "results.md", "answer")])
def test_no_answer_row_sets_a_mean_beside_a_delta_over_other_seeds(page, block):
    """In each row the Δ is the difference of the two means it is printed with: of the row's
    mean and its baseline row's mean (up to their rounding) when both cells have exactly the
    Δ's seeds, else of the two means over the shared seeds that follow it, recomputed here
    from each seed's BLEU."""
    summary = json.loads((DOCS / "equal" / "primary" / "summary.json").read_text())
    rows = _answer_rows(page, block)
    means = {(row[0], f"{row[1]}/{row[2].strip('`')}"): float(row[4].split()[0]) for row in rows}
    for row in rows:
        if row[-1] == "baseline":
            continue
        arch, tying, layer = row[0].strip("`"), row[1], row[2].strip("`")
        untied = "untied" in row[5]
        test = summary[arch][f"{tying}/{layer}"]["vs_untied" if untied else "vs_dot"]
        cell = summary[arch][f"{tying}/{layer}"]
        against = "none/dot" if untied else f"{tying}/dot"
        other = summary[arch][against]
        shared = sorted(int(s) for s in test["per_seed_delta"])
        delta = float(row[5].split()[0])
        if sorted(cell["seeds"]) == shared == sorted(other["seeds"]):
            assert "seeds" not in row[5], row
            assert float(row[4].split()[0]) - means[row[0], against] == pytest.approx(
                delta, abs=0.011)
            continue
        a, b = (np.mean([dict(zip(c["seeds"], c["bleu"]["values"], strict=True))[s]
                         for s in shared]) for c in (cell, other))
        assert f"(seeds {', '.join(map(str, shared))}: {a:.2f} − {b:.2f})" in row[5], row
        assert a - b == pytest.approx(delta, abs=0.006)


@pytest.mark.parametrize("page, block", [(REPO / "README.md", "does_it_help"),
                                         (DOCS / "results.md", "answer")])
def test_a_tying_claim_is_supported_by_equivalence_alone(page, block):
    """Each "tying keeps BLEU" row against its seeds' differences: supported exactly where the
    90 % interval (Student t, recomputed here) lies inside ±0.5 and Holm keeps the equivalence
    test, contradicted only by a difference that counts, never supported by a non-significant
    difference."""
    summary = json.loads((DOCS / "equal" / "primary" / "summary.json").read_text())
    rows = [r for r in _answer_rows(page, block) if "untied" in r[5]]
    assert len(rows) == 2
    for row in rows:
        test = summary[row[0].strip("`")][f"{row[1]}/dot"]["vs_untied"]
        deltas = list(test["per_seed_delta"].values())
        low, high = stats.t.interval(0.90, len(deltas) - 1, loc=np.mean(deltas),
                                     scale=stats.sem(deltas))
        inside = -0.5 < low and high < 0.5 and test["equivalence"]["p_holm"] < 0.05
        verdict = row[-1]
        assert verdict.startswith("supported") == inside, row
        assert f"equivalence p = {test['equivalence']['p']:.3f}" in row[6], row
        if verdict.startswith("contradicted"):
            assert test["p_holm"] < 0.05 and len({d > 0 for d in deltas}) == 1, row


def test_the_primary_family_is_the_pre_registered_runs_alone():
    """equal_primary reads E1-E3 (seeds 1-3 of the cells fixed before any run) and nothing
    that F1-F5 added: no fixnorm, no DynamicConv layer but dot and l2norm, no seed 4 or 5."""
    summary = json.loads((DOCS / "equal" / "primary" / "summary.json").read_text())
    cells = {(model, label): cell["seeds"] for model, by_label in summary.items()
             for label, cell in by_label.items()}
    e1 = {("transformer_twwt", f"three_way/{la}") for la in LAYERS}
    e2 = {("dynamicconv_twwt", f"three_way/{la}") for la in ("dot", "l2norm")}
    e3 = {("transformer_twwt", f"{t}/dot") for t in ("none", "decoder")}
    assert set(cells) == e1 | e2 | e3
    assert all(seeds == [1, 2, 3] for seeds in cells.values())


def test_the_equal_training_study_has_every_run_of_its_sweep():
    """Every run that slurm/bible_equal.yaml expands to has its record (27 + 23 = 50), and no
    record is outside the sweep."""
    sweep = load_sweep(REPO / "slurm" / "bible_equal.yaml", check_data=False)
    expected = {run.name for run in sweep.runs}
    recorded = [r.run.name for r in _records(DOCS / "equal")]
    assert len(expected) == 50 and len(recorded) == len(set(recorded))
    assert set(recorded) == expected, sorted(expected ^ set(recorded))
