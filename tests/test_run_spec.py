"""A run described once: the sweep's spec is what ``run.json`` holds and what every tool reads
back; the identity is resolved from ``run.json`` and the checkpoint by one rule, which refuses
where they disagree."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import fields

import pytest

from fairseq_tying.common.checkpoints import CheckpointConfig
from fairseq_tying.common.run_spec import Identity, RunSpec, read_run_json, write_run_json
from fairseq_tying.evaluation.result import PerplexityResult, TranslationResult, read_result
from fairseq_tying.evaluation.run import RunFacts
from fairseq_tying.launch.job import EvalJob, TrainJob
from fairseq_tying.sweeps.config import Run, load_sweep
from tests.helpers import REPO

# the run.json of a run launched before the identity had its own type (a quarter study's run)
LAUNCHED = {"arch": "transformer_twwt", "data_bin": "/d/bin", "data_dir": "/d", "dataset": "q",
            "gpu": False, "name": "q.transformer_twwt.three_way.fixnorm.s3",
            "output_layer": "fixnorm", "resources": {"nodes": 1, "time_min": 1440},
            "run_dir": "/runs/q.transformer_twwt.three_way.fixnorm.s3", "seed": 3,
            "stopping": {"max_epoch": 12, "plateau": False}, "sweep": "q",
            "sweep_file": "/s/q.yaml", "tag": None, "task": "translation",
            "train_args": ["--arch", "transformer_twwt", "--seed", "3"], "tying": "three_way",
            "update_freq": 1, "world_size": 1}


def test_the_sweeps_spec_is_what_run_json_holds_and_what_the_jobs_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRSEQ_TYING_TINY_DATA", str(tmp_path / "data"))
    sweep = load_sweep(REPO / "slurm" / "tiny_cpu.yaml", output_dir=tmp_path, check_data=False)
    run = sweep.runs[-1]
    spec = sweep.spec(run)
    assert spec.identity is run.identity and spec.stopping is run.stopping
    assert run.name == "tiny.transformer_twwt.three_way.l2norm.s2" == spec.name
    write_run_json(spec)
    assert read_run_json(run.run_dir) == spec
    written = json.loads((run.run_dir / "run.json").read_text())
    assert written["seed"] == 2 and "identity" not in written and "method" not in written
    argv = TrainJob(spec, "PLUGIN").command()
    args = run.identity.train_args
    assert argv[1] == spec.data_bin and argv[-len(args):] == args
    assert EvalJob(spec, sweep.evaluation).run is spec


def test_a_launched_run_json_reads_back_and_names_its_run(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(LAUNCHED))
    spec = read_run_json(tmp_path)
    assert spec.identity == Identity(name=LAUNCHED["name"], dataset="q", arch="transformer_twwt",
                                     tying="three_way", output_layer="fixnorm", seed=3,
                                     train_args=LAUNCHED["train_args"], task="translation")
    assert (spec.data_dir, spec.world_size, spec.stopping["max_epoch"]) == ("/d", 1, 12)
    assert spec.to_dict() == {k: v for k, v in LAUNCHED.items() if v is not None}
    (tmp_path / "run.json").write_text(json.dumps({"seed": 1}))
    assert read_run_json(tmp_path).name == tmp_path.name  # no name: the folder's
    assert read_run_json(tmp_path / "nowhere") is None


@pytest.mark.parametrize("bad", [{"label": "L"}, {"output-layer": "dot"}, {"identity": {}}])
def test_a_key_the_spec_does_not_declare_is_refused_by_name(tmp_path, bad):
    (tmp_path / "run.json").write_text(json.dumps({"name": "r", **bad}))
    with pytest.raises(ValueError, match=rf"run\.json: unknown key\(s\) \['{next(iter(bad))}'\]"):
        read_run_json(tmp_path)


def test_run_json_and_the_checkpoint_make_one_identity_or_are_refused(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    config = CheckpointConfig.of({"args": Namespace(arch="a", tying="none", seed=1)})
    facts = RunFacts.read(run, config)
    assert facts.identity == Identity(name="r", method="a:none:dot", arch="a", tying="none",
                                      output_layer="dot", seed=1)
    with pytest.raises(ValueError, match=r"--data is required .*run\.json names no data_dir"):
        facts.data(None)
    (run / "run.json").write_text(json.dumps({"method": "L", "seed": 1, "data_dir": "/d"}))
    facts = RunFacts.read(run).with_checkpoint(config)
    assert facts.identity.to_dict() == {"name": "r", "method": "L", "arch": "a", "tying": "none",
                                        "output_layer": "dot", "seed": 1}
    assert facts.data(None) == "/d" and facts.data("/other") == "/other"
    # run.json fills what the checkpoint leaves out, never overrides what it says
    (run / "run.json").write_text(json.dumps({"seed": 2}))
    with pytest.raises(ValueError, match=r"run\.json says seed 2, its checkpoint says 1"):
        RunFacts.read(run, config)
    recorded = Identity(name="r", arch="b", tying="decoder", seed=2)
    facts = RunFacts.read(run, recorded=recorded)  # an evaluation's record stands in
    assert (facts.identity.arch, facts.identity.tying, facts.identity.seed) == ("b", "decoder", 2)
    with pytest.raises(ValueError, match=r"seed 2, its evaluation's record of it says 5"):
        RunFacts.read(run, recorded=Identity(name="r", seed=5))


def test_the_demos_run_json_is_written_by_the_one_writer(tmp_path):
    from fairseq_tying.demo import demo_identity, train_command

    identity = demo_identity("bible", "l2norm", 7)
    assert identity.name == "bible.transformer_twwt.three_way.l2norm.s7"  # as a sweep names it
    argv = train_command(tmp_path / "data", tmp_path / identity.name, identity, 10)
    spec = read_run_json(tmp_path / identity.name)
    assert isinstance(spec, RunSpec) and spec.data_dir == str(tmp_path / "data")
    assert spec.identity == identity and argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--output-layer") + 1] == "l2norm"


def test_an_evaluation_reads_back_typed_and_refuses_what_it_does_not_declare(tmp_path):
    result = TranslationResult(run=Identity(name="r", seed=1), subset="test", bleu=20.0,
                               tok_bleu=21.0, chrf=40.0, src="es", tgt="en",
                               hypotheses="test.hyp.en", references="/refs",
                               references_sha256="0" * 64, averaged=["c1.pt", "c2.pt"])
    path = result.save(tmp_path / "eval.json")
    assert read_result(path) == result
    data = json.loads(path.read_text())
    assert data["run"] == {"name": "r", "seed": 1}
    path.write_text(json.dumps({**data, "bleu_score": 1.0}))
    with pytest.raises(ValueError, match=r"eval\.json: unknown key\(s\) \['bleu_score'\]"):
        read_result(path)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "references_sha256"}))
    with pytest.raises(ValueError, match=r"eval\.json: lacks \['references_sha256'\]"):
        read_result(path)
    lm = {"task": "language_modeling", "run": {"name": "lm"}, "subset": "test", "loss": 5.0,
          "perplexity": 32.0, "n_tokens": 10}
    path.write_text(json.dumps(lm))
    assert isinstance(read_result(path), PerplexityResult)


def test_a_sweeps_run_holds_its_identity_and_declares_none_of_its_fields():
    assert not {f.name for f in fields(Run)} & {f.name for f in fields(Identity)}
    run = Identity.named(dataset="bible", arch="transformer_twwt", tying="three_way",
                         output_layer="l2norm", tag="tiedL", seed=3)
    assert run.name == "bible.transformer_twwt.three_way.l2norm.tiedL.s3"
    assert Identity.split_name(run.name) == ("bible.transformer_twwt.three_way.l2norm.tiedL", 3)
    bare = Identity.named(dataset="q", arch="transformer_lm_tied", seed=12)
    assert bare.name == "q.transformer_lm_tied.s12"
    assert Identity.split_name(bare.name) == ("q.transformer_lm_tied", 12)
    assert Identity.split_name("demo-run") == ("demo-run", None)
