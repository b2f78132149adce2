"""Sweep validation and the dry run: no cluster needed, nothing is ever submitted."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from fairseq_tying.launch.__main__ import main
from fairseq_tying.launch.continuation import without_length
from fairseq_tying.launch.job import DONE
from fairseq_tying.launch.local import Forecast, local_order, training_now
from fairseq_tying.sweeps.config import SweepError, load_sweep
from fairseq_tying.sweeps.grid import GRID_KEYS
from fairseq_tying.sweeps.plateau import Plateau, record_epoch, write_history
from fairseq_tying.sweeps.sweep import EVALUATION, Batch, Resources, Sweep, section_fields
from fairseq_tying.sweeps.sweepfile import STOPPING_FIELDS
from tests.helpers import REPO, launch, write_sweep

# the tiny sweep's fairseq section without its update budget: a `stopping:` section decides
EPOCHS = {"max_update": None, "save_interval_updates": None, "keep_interval_updates": None,
          "no_epoch_checkpoints": None}


@pytest.mark.parametrize(("changes", "key"), [
    ({"resource": {"nodes": 1}}, "resource: unknown key"),
    ({"resources": {"gpu": 1}}, "resources.gpu: unknown key"),
    ({"resources": {"time_min": 60}}, "resources.time_min: unknown key"),
    ({"grid": {"arch": ["transformer_twwt", "transformer_nosuch"]}}, "grid.arch"),
    ({"grid": {"output_layer": ["dot", "softmax2"]}}, "grid.output_layer"),
    ({"datasets": {"tiny": "/nonexistent/data"}}, "datasets.tiny"),
    ({"resources": {"nodes": 0}}, "resources.nodes"),
    ({"resources": {"mem_gb": -1}}, "resources.mem_gb"),
    ({"resources": {"time": "forever"}}, "resources.time"),
    ({"resources": {"gpus_per_node": 4, "tasks_per_node": 2}}, "resources.tasks_per_node"),
    ({"resources": {"nodes": 2}, "batch": {"target_gpus": 3}}, "batch.target_gpus"),
    ({"batch": {"fp16": True}}, "batch.fp16"),
    ({"fairseq": {"update_freq": 4}}, "fairseq.update_freq"),
    ({"grid": {"flags": {"tied_projection": True}}}, "grid.flags: runs with their own flags"),
    ({"grid": {"flags": {"seed": 3}, "tag": "x"}}, "grid.flags.seed"),
    ({"grid": {"flags": {"lr": 0.1}, "tag": "x"}}, "grid.flags.lr: also set in the fairseq"),
    ({"grid": {"flags": {"max_epoch": 3}, "tag": "x"}}, "grid.flags.max_epoch"),
    ({"grid": {"flags": [1], "tag": "x"}}, "grid.flags: expected a mapping"),
    ({"grid": {"tag": "tied L"}}, "grid.tag"),
    ({"grid": {"priority": 0}}, "grid.priority"),
    ({"evaluation": {"args": ["--beem", "2"]}}, "evaluation.args"),
    ({"evaluation": {"also": {"best": ["--nosuch"]}}}, "evaluation.also.best"),
    ({"stopping": {"plateau": "no"}, "fairseq": EPOCHS}, "stopping.plateau"),
    ({"continue_from": "/elsewhere/runs"}, "continue_from: needs a `stopping:` section"),
    ({"continue_from": 3, "stopping": {}, "fairseq": EPOCHS}, "continue_from: expected"),
])
def test_bad_sweep_names_the_key(tmp_path, tiny_data, monkeypatch, capsys, changes, key):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    sweep = write_sweep(tmp_path / "bad.yaml", output_dir=str(tmp_path / "out"), **changes)
    with pytest.raises(SweepError, match=key.replace(".", r"\.")):
        load_sweep(sweep)
    assert main([str(sweep)]) == 2  # the CLI reports it and exits before submitting
    err = capsys.readouterr().err
    assert key in err and "error:" in err
    assert not (tmp_path / "out").exists()


# a valid value of every key of a section, unlike tiny_cpu.yaml's, and (given, read) if it is read
# as another value
RESOURCES = {"nodes": 2, "gpus_per_node": 1, "tasks_per_node": 2, "cpus_per_task": 3,
             "mem_gb": 2.5, "partition": "debug", "time": ("1-02:03:04", 1564),
             "constraint": "a100", "account": "lab", "qos": "high", "max_num_timeout": 7,
             "array_parallelism": 5, "signal_delay_s": 60}
EVALUATIONS = {"enabled": False, "args": (["--beam", 3], ["--beam", "3"]),
               "also": {"best": ["--checkpoint", "checkpoint_best.pt"]},
               "time": ("2:30:00", 150), "cpus_per_task": 2, "mem_gb": 6}


def _load(tmp_path, monkeypatch, **changes):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tmp_path / "data"))
    return load_sweep(write_sweep(tmp_path / "s.yaml", **changes), check_data=False)


@pytest.mark.parametrize(("section", "samples"), [("resources", RESOURCES),
                                                  ("evaluation", EVALUATIONS)])
def test_every_key_of_a_section_sets_its_field(tmp_path, monkeypatch, section, samples):
    """A section's keys are its dataclass fields (``resources.time`` is ``Resources.time_min``,
    ``evaluation.time`` is ``Sweep.eval_time_min``): each key, set alone, lands in its field,
    and the samples name every key, so a field added without reaching a sweep fails here."""
    def owner(sweep):
        return sweep.resources if section == "resources" else sweep

    settings = section_fields(Resources) if section == "resources" else section_fields(
        Sweep, EVALUATION)
    assert set(samples) == set(settings)
    plain = _load(tmp_path, monkeypatch)
    for key, sample in samples.items():
        given, read = sample if isinstance(sample, tuple) else (sample, sample)
        field = settings[key].name
        sweep = _load(tmp_path, monkeypatch, **{section: {key: given}})
        assert getattr(owner(sweep), field) == read != getattr(owner(plain), field), key


def test_every_stopping_and_batch_key_reaches_the_runs(tmp_path, monkeypatch):
    """``stopping:`` sets the plateau rule's fields (all but ``maximize``, which follows
    fairseq's --maximize-best-checkpoint-metric); each ``batch:`` key changes the runs' flags."""
    stopping = {"patience": 4, "min_gain": 0.01, "min_epoch": 2, "max_epoch": 9,
                "plateau": False}
    assert set(stopping) == set(STOPPING_FIELDS) == set(vars(Plateau())) - {"maximize"}
    run = _load(tmp_path, monkeypatch, stopping=stopping, fairseq=EPOCHS).runs[0]
    assert run.stopping == stopping and Plateau(**stopping).max_epoch == 9
    gpu = {"gpus_per_node": 1}
    batches = {"max_tokens": ({"max_tokens": 123}, {}, ["--max-tokens", "123"]),
               "target_gpus": ({"target_gpus": 4}, {}, ["--update-freq", "4"]),
               "update_freq": ({"update_freq": 3, "target_gpus": None}, {},
                               ["--update-freq", "3"]),
               "fp16": ({"fp16": False}, gpu, [])}  # --fp16 is on by default on GPUs
    assert set(batches) == set(section_fields(Batch))
    for key, (batch, resources, flags) in batches.items():
        without = {k: v for k, v in batch.items() if k != key}
        args = _load(tmp_path, monkeypatch, batch=batch,
                     resources=resources).runs[0].identity.train_args
        plain = _load(tmp_path, monkeypatch, batch=without,
                      resources=resources).runs[0].identity.train_args
        assert args != plain and " ".join(flags) in " ".join(args), key
    assert GRID_KEYS == {"dataset", "arch", "tying", "output_layer", "seed", "priority", "tag",
                         "flags"}


def test_the_documented_keys_are_the_accepted_ones():
    """docs/slurm.md's table of sections names each key a section accepts."""
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$",
                                             (REPO / "docs" / "slurm.md").read_text(), re.M)}
    accepted = {"resources": section_fields(Resources),
                "evaluation": section_fields(Sweep, EVALUATION),
                "batch": section_fields(Batch), "stopping": STOPPING_FIELDS, "grid": GRID_KEYS}
    for section, keys in accepted.items():
        documented = set(re.findall(r"`(\w+)`", rows[section]))
        assert set(keys) <= documented, (section, set(keys) - documented)


def test_grid_expansion_and_update_freq(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    sweep = load_sweep(write_sweep(tmp_path / "s.yaml", resources={"nodes": 2},
                                   batch={"target_gpus": 8}), output_dir=tmp_path / "runs")
    names = [r.name for r in sweep.runs]
    assert len(names) == len(set(names)) == 4  # 2 output layers x 2 seeds, all distinct
    assert all(r.run_dir.parent == tmp_path / "runs" for r in sweep.runs)
    args = sweep.runs[0].identity.train_args
    assert args[args.index("--update-freq") + 1] == "4"  # 8 simulated workers on 2
    assert "--cpu" in args and "--fp16" not in args


def test_a_sweep_states_what_differs_from_its_base(tmp_path, tiny_data, monkeypatch):
    """``base:``: each section the file names replaces the base's; the rest is inherited."""
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    write_sweep(tmp_path / "base.yaml", stopping={"patience": 2, "max_epoch": 9}, fairseq=EPOCHS)
    (tmp_path / "sub").mkdir()
    variant = tmp_path / "sub" / "v.yaml"
    variant.write_text("base: ../base.yaml\nname: variant\n"
                       "stopping: {max_epoch: 5, plateau: false}\n")
    base, sweep = load_sweep(tmp_path / "base.yaml"), load_sweep(variant)
    assert sweep.name == "variant" and base.name != "variant"
    assert sweep.runs[0].stopping == {"patience": 3, "min_gain": 0.005, "min_epoch": 1,
                                      "max_epoch": 5, "plateau": False}
    assert [r.name for r in sweep.runs] == [r.name for r in base.runs]
    strip = without_length  # the commands differ in their length alone
    assert [strip(r.identity.train_args) for r in sweep.runs] == \
        [strip(r.identity.train_args) for r in base.runs]
    (tmp_path / "loop.yaml").write_text("base: sub/loop2.yaml\n")
    (tmp_path / "sub" / "loop2.yaml").write_text("base: ../loop.yaml\n")
    with pytest.raises(SweepError, match="loop.yaml is the file itself or includes it"):
        load_sweep(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("base: nosuch.yaml\n")
    with pytest.raises(SweepError, match=r"base: sweep file .*nosuch\.yaml does not exist"):
        load_sweep(tmp_path / "orphan.yaml")


def test_the_equal_training_sweep_is_the_converged_study_with_a_fixed_budget():
    """slurm/bible_equal.yaml: E1 (three-way x every layer), E2 (DynamicConv three-way x
    {dot, l2norm}), E3 (untied and decoder-tied dot), 3 seeds each, in that order, then F1-F5
    (seeds 4 and 5 of the headline cells, fixnorm, every DynamicConv layer); every run is its
    converged twin, flag for flag but the length (an F run: its model's three-way dot run of
    seed 1 but its layer and seed), trained 40 epochs without early stopping."""
    converged = load_sweep(REPO / "slurm" / "bible_converged.yaml", check_data=False)
    equal = load_sweep(REPO / "slurm" / "bible_equal.yaml", check_data=False)
    twin = {r.name: r for r in converged.runs}
    cells = {p: sorted({(r.identity.arch, r.identity.tying, r.identity.output_layer)
                        for r in equal.runs if r.priority == p})
             for p in (1, 2, 3)}
    assert cells == {
        1: sorted(("transformer_twwt", "three_way", la)
                  for la in ("dot", "l2norm", "sqnorm", "distance", "cosine")),
        2: sorted(("dynamicconv_twwt", "three_way", la) for la in ("dot", "l2norm")),
        3: sorted(("transformer_twwt", t, "dot") for t in ("none", "decoder"))}
    later = {p: sorted({(r.identity.arch, r.identity.output_layer, r.identity.seed)
                        for r in equal.runs if r.priority == p})
             for p in (4, 5, 6, 7, 8)}
    tr, dc = "transformer_twwt", "dynamicconv_twwt"
    assert later == {
        4: sorted((tr, la, s) for la in ("dot", "l2norm") for s in (4, 5)),
        5: sorted((tr, "fixnorm", s) for s in (1, 2, 3)),
        6: sorted((dc, la, s) for la in ("sqnorm", "distance", "cosine") for s in (1, 2, 3)),
        7: sorted((dc, "fixnorm", s) for s in (1, 2, 3)),
        8: sorted((dc, la, s) for la in ("dot", "l2norm") for s in (4, 5))}
    assert len(equal.runs) == 50 and {r.identity.seed for r in equal.runs} == {1, 2, 3, 4, 5}
    for r in equal.runs:
        base = twin.get(r.name) or twin[f"bible.{r.identity.arch}.three_way.dot.s1"]
        want = [a.replace(base.name, r.name) for a in without_length(base.identity.train_args)]
        want[want.index("--seed") + 1] = str(r.identity.seed)
        want[want.index("--output-layer") + 1] = r.identity.output_layer
        assert without_length(r.identity.train_args) == want, r.name
        assert r.stopping["plateau"] is False and r.stopping["max_epoch"] == 40
    assert equal.continue_from is None and equal.output_dir != converged.output_dir
    assert (equal.eval_args, equal.eval_also) == (converged.eval_args, converged.eval_also)


LAYERS_CHECKED = ("three_way.dot", "three_way.l2norm")


@pytest.mark.parametrize(("name", "lr", "data", "cells"), [
    ("bible_quarter_lr_half", "0.0015", "work/quarter/data", LAYERS_CHECKED),
    ("bible_quarter_lr_double", "0.006", "work/quarter/data", LAYERS_CHECKED),
    ("bible_quarter_s2", "0.003", "work/quarter_s2/data", ("none.dot", *LAYERS_CHECKED)),
])
def test_the_quarters_checks_are_its_pilots_runs_but_lr_or_draw(name, lr, data, cells):
    """The learning-rate check and the second draw of the quarter study: each run is the quarter
    pilot's run of its cell, flag for flag but the learning rate (or the data) and the length,
    seeds 1-3, each trained exactly 19 epochs (the latest plateau of the pilot's paper cells:
    untied dot 12, three-way dot 15, l2norm 19, fixnorm 19), in output folders of their own."""
    pilot = load_sweep(REPO / "slurm" / "bible_quarter_pilot.yaml", check_data=False)
    sweep = load_sweep(REPO / "slurm" / f"{name}.yaml", check_data=False)
    twin = {r.name.split(".", 2)[2].rsplit(".", 1)[0]: r for r in pilot.runs}
    assert sorted({r.name.split(".", 2)[2].rsplit(".", 1)[0] for r in sweep.runs}) == \
        sorted(cells)
    assert len(sweep.runs) == 3 * len(cells)
    for r in sweep.runs:
        base = twin[r.name.split(".", 2)[2].rsplit(".", 1)[0]]
        want = [a.replace(base.name, r.name) for a in without_length(base.identity.train_args)]
        want[want.index("--seed") + 1] = str(r.identity.seed)
        want[want.index("--lr") + 1] = lr
        assert without_length(r.identity.train_args) == want, r.name
        assert r.stopping["plateau"] is False and r.stopping["max_epoch"] == 19
        assert r.data_dir.as_posix().endswith(data)
    assert not sweep.output_dir.as_posix().endswith(("work/quarter/runs", "work/quarter/pilot"))


def test_the_fp16_sweep_is_p1_of_the_converged_one_on_a_gpu():
    """slurm/bible_converged_fp16.yaml: the CPU study's P1 runs, flag for flag, with --fp16 in
    place of --cpu and one GPU a run; the plateau rule and the scoring are the CPU study's."""
    converged = load_sweep(REPO / "slurm" / "bible_converged.yaml", check_data=False)
    fp16 = load_sweep(REPO / "slurm" / "bible_converged_fp16.yaml", check_data=False)
    p1 = {r.name: r for r in converged.runs if r.priority == 1}
    assert sorted(r.name for r in fp16.runs) == sorted(p1)
    for r in fp16.runs:
        cpu_args = p1[r.name].identity.train_args
        assert r.identity.train_args == [("--fp16" if a == "--cpu" else a) for a in cpu_args]
        assert r.stopping == p1[r.name].stopping
    assert fp16.resources.gpus_per_node == 1 and fp16.output_dir != converged.output_dir
    assert (fp16.eval_args, fp16.eval_also) == (converged.eval_args, converged.eval_also)


def test_the_lm_study_sweep_expands_to_its_21_runs():
    """slurm/bible_lm.yaml: 7 cells x 3 seeds; the tied+L block's flags and tag reach its runs
    only, and its evaluation is fairseq-eval-lm's (translation flags are refused)."""
    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    assert sweep.task == "language_modeling" and len(sweep.runs) == 21
    tied_l = [r for r in sweep.runs if r.identity.tag == "tiedL"]
    assert [r.name for r in tied_l] == [f"bible_en.transformer_lm_tied.decoder.dot.tiedL.s{s}"
                                        for s in (1, 2, 3)]
    for run in sweep.runs:
        args = run.identity.train_args
        assert ("--tied-embed-dim" in args) == (run.identity.tag == "tiedL") \
            == ("--tied-projection" in args)
        assert args[args.index("--task") + 1] == "language_modeling"
        assert sweep.spec(run).identity.task == "language_modeling"
    tied_args = tied_l[0].identity.train_args
    assert tied_args[tied_args.index("--tied-embed-dim") + 1] == "64"
    assert {(r.identity.tying, r.identity.output_layer) for r in sweep.runs
            if r.identity.tag is None} == {
        ("none", "dot"), *(("decoder", la) for la in ("dot", "l2norm", "sqnorm", "distance",
                                                       "cosine"))}


def test_progress_names_the_epoch_each_running_run_has_reached(tmp_path):
    """The local progress bar's line: the last validated epoch of each running run, read from
    its valid_history.json, under its name without the dataset and arch."""
    import dataclasses

    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    runs = [dataclasses.replace(r, run_dir=tmp_path / r.name) for r in sweep.runs[:2]]
    history: list[dict] = []
    for epoch, value in enumerate([7.552, 6.878, 6.571], start=1):
        history = record_epoch(history, epoch, 211 * epoch, value)
    (tmp_path / runs[0].name).mkdir()
    write_history(tmp_path / runs[0].name, history, "loss")
    assert training_now(runs) == "none.dot.s1 epoch 3 (6.571), none.dot.s2 starting"
    assert training_now([]) == ""


def _validated(run, epochs: int) -> None:
    history: list[dict] = []
    for epoch in range(1, epochs + 1):
        history = record_epoch(history, epoch, 211 * epoch, 8.0 - epoch / 10)
    run.run_dir.mkdir(exist_ok=True)
    write_history(run.run_dir, history, "loss")


def test_forecast_of_the_time_left_from_the_pace_and_the_finished_runs(tmp_path):
    """slurm/bible_lm.yaml stops a run at epoch 5 at the earliest. Run A starts at epoch 2, B
    from scratch; 20 minutes later they are at 4 and 2: 4 epochs in 1,200 s, 300 s an epoch.
    Before any run has finished, each needs at least 5 epochs: (5-4) + (5-2) = 4 epochs left,
    20 min, a lower bound. Runs recorded at 12 and 15 epochs make 13.5 the expectation:
    9.5 + 11.5 = 21 epochs, 105 min, and it holds still until another epoch ends. A run that
    finishes here at epoch 10 adds its stop."""
    import dataclasses

    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    a, b = (dataclasses.replace(r, run_dir=tmp_path / r.name) for r in sweep.runs[:2])
    _validated(a, 2)
    now = [0.0]
    fresh = Forecast([a, b], [], clock=lambda: now[0], max_gap=None)
    recorded = Forecast([a, b], [12, 15], clock=lambda: now[0], max_gap=None)
    now[0] = 600.0
    assert fresh([a, b]) == ""  # no epoch has ended here yet: no pace
    _validated(a, 4)
    _validated(b, 2)
    now[0] = 1200.0
    assert fresh([a, b]) == "≥ 20 min left (runs of 5 epochs or more)"
    assert recorded([a, b]) == "≈ 1 h 45 min left (runs of 13.5 epochs)"
    now[0] = 1500.0  # no epoch has ended since 1200 s: the pace is still 300 s an epoch
    assert recorded([a, b]) == "≈ 1 h 45 min left (runs of 13.5 epochs)"
    (b.run_dir / DONE).write_text('{"stop": {"epoch": 10, "update": 2110, "reason": "plateau"}}')
    fresh.finished(b)
    assert fresh.stops == [10] and fresh([a]) == "≈ 30 min left (runs of 10 epochs)"
    assert Forecast([dataclasses.replace(a, stopping=None)], [12])([a]) == ""


def test_forecast_leaves_out_the_time_a_sweep_was_suspended(tmp_path):
    """The bar asks every 30 s. Run A starts at epoch 2 and B from scratch; after 300 s of
    ticks the launcher is stopped for an hour (SIGSTOP), resumed, and 300 s later A is at 4
    and B at 2. The hour counts as one 120 s gap: 4 epochs in 720 s, so the 4 epochs left to
    the earliest stop (5) take 12 min, not the 1 h 10 min of the wall clock's 4,200 s."""
    import dataclasses

    sweep = load_sweep(REPO / "slurm" / "bible_lm.yaml", check_data=False)
    a, b = (dataclasses.replace(r, run_dir=tmp_path / r.name) for r in sweep.runs[:2])
    _validated(a, 2)
    now = [0.0]
    running = Forecast([a, b], [], clock=lambda: now[0])
    wall = Forecast([a, b], [], clock=lambda: now[0], max_gap=None)
    ticks = [*range(30, 301, 30), *range(3900, 4171, 30)]  # the hour stopped after 300 s
    for t in ticks:
        now[0] = float(t)
        assert running([a, b]) == wall([a, b]) == ""  # no epoch has ended yet
    now[0] = 4200.0
    _validated(a, 4)
    _validated(b, 2)
    assert running([a, b]) == "≥ 12 min left (runs of 5 epochs or more)"
    assert wall([a, b]) == "≥ 1 h 10 min left (runs of 5 epochs or more)"


def test_lm_sweep_refuses_translation_evaluation_flags(tmp_path):
    text = (REPO / "slurm" / "bible_lm.yaml").read_text().replace(
        'args: [--average-last, "5"]', 'args: [--average-last, "5", --beam, "5"]')
    sweep = tmp_path / "lm.yaml"
    sweep.write_text(text)
    with pytest.raises(SweepError, match=r"evaluation\.args: .*--beam.*evaluate-lm"):
        load_sweep(sweep, check_data=False)


@pytest.mark.parametrize("name", ["bible_converged.yaml", "bible_converged_gpu.yaml",
                                  "bible_converged_fp16.yaml"])
def test_converged_sweeps_train_p1_seed_by_seed(name):
    """P1's two grids share a priority: a local sweep trains seed 1 of all 7 cells (the untied
    and decoder-tied baselines included) before any seed 2, and P2/P3 after all of P1."""
    sweep = load_sweep(REPO / "slurm" / name, check_data=False)
    order = [(r.identity.tying, r.identity.output_layer, r.identity.seed, r.identity.arch)
             for r in local_order(sweep.runs)]
    p1 = {("three_way", la) for la in ("dot", "l2norm", "sqnorm", "distance", "cosine")} | {
        ("none", "dot"), ("decoder", "dot")}
    for seed in (1, 2, 3):
        block = order[7 * (seed - 1):7 * seed]
        assert {(t, la) for t, la, _, _ in block} == p1 and {s for _, _, s, _ in block} == {seed}
    assert all(a.startswith("transformer_twwt") for *_, a in order[:21])
    assert len(order) == (39 if name == "bible_converged.yaml" else 21)  # P1 alone in the others
    if name == "bible_converged.yaml":  # two workers: the baselines first, every delta needs them
        assert [(t, la) for t, la, _, _ in order[:3]] == [
            ("none", "dot"), ("decoder", "dot"), ("three_way", "dot")]


def test_the_gpu_converged_sweep_is_fp16_at_the_iwslt_size():
    sweep = load_sweep(REPO / "slurm" / "bible_converged_gpu.yaml", check_data=False)
    run = sweep.runs[0]
    args = run.identity.train_args
    assert run.identity.arch == "transformer_twwt_iwslt_de_en" and run.resources.gpu
    assert "--fp16" in args and "--cpu" not in args
    assert args[args.index("--max-tokens") + 1] == "8192"
    assert run.stopping["patience"] == 6 and run.stopping["max_epoch"] == 40


@pytest.mark.slow  # runs the tool
def test_dry_run_of_the_fp16_gpu_sweep():
    """The GPU path (no GPU here): sbatch parameters and fairseq commands, nothing submitted."""
    proc = launch("slurm/iwslt_transformer.yaml", "--dry-run", "--only", "*dot.s1")
    out = proc.stdout
    assert "#SBATCH --gpus-per-node=4" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --ntasks-per-node=4" in out
    assert "#SBATCH --signal=USR2@" in out and "#SBATCH --time=" in out
    cmd = next(line for line in out.splitlines() if line.startswith("fairseq-train"))
    argv = shlex.split(cmd)
    assert "--fp16" in argv and "--cpu" not in argv
    # 128 simulated GPUs on 2 nodes x 4 GPUs
    assert argv[argv.index("--update-freq") + 1] == "16"
    assert argv[argv.index("--output-layer") + 1] == "dot"
    assert "aftercorr" in out  # evaluation waits for its training task
    assert not Path(REPO, "runs", "iwslt_transformer").exists()


@pytest.mark.slow
def test_only_filters_runs_and_rejects_no_match(tmp_path, tiny_data):
    sweep = write_sweep(tmp_path / "s.yaml", output_dir=str(tmp_path / "out"))
    proc = launch(str(sweep), "--dry-run", "--only", "*l2norm.s2", data=tiny_data)
    assert proc.stdout.count("\nfairseq-train ") == 1 and "l2norm.s2" in proc.stdout
    proc = launch(str(sweep), "--dry-run", "--only", "*nothing*", data=tiny_data, check=False)
    assert proc.returncode == 2 and "--only" in proc.stderr


def test_launching_in_process_leaves_the_callers_environment_as_it_was(tmp_path, tiny_data,
                                                                        monkeypatch):
    """The kernel pins and thread count are for the jobs a launch starts, not for the process
    that called it (a study, a test) and its later work."""
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tiny_data))
    sweep = write_sweep(tmp_path / "s.yaml", output_dir=str(tmp_path / "out"))
    before = dict(os.environ)
    assert main([str(sweep), "--dry-run"]) == 0
    assert dict(os.environ) == before
