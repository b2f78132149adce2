"""The typed record: every committed record reads and writes back unchanged (but for the
schema line), the file layout is checked (unknown keys, other schemas), and the run folder's
facts are read once (``RunFacts``, ``CheckpointConfig``)."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import fields, replace
from pathlib import Path

import pytest

from fairseq_tying.common.checkpoints import CheckpointConfig
from fairseq_tying.evaluation.result import PerplexityResult, TranslationResult
from fairseq_tying.studies.records.record import (
    NOT_RECORDED,
    SCHEMA,
    Perplexity,
    Record,
    Stop,
    Translation,
)
from fairseq_tying.studies.records.records import build_record, export
from tests.helpers import REPO

RECORDS = sorted(REPO.glob("docs/*/records/*.json"))
CONVERGED = REPO / "docs" / "converged" / "records" / "bible.transformer_twwt.none.dot.s1.json"


def test_every_committed_record_round_trips_byte_for_byte(tmp_path):
    assert len(RECORDS) >= 116
    for path in RECORDS:
        record = Record.load(path)
        record.save(tmp_path / path.name)
        text = path.read_text(encoding="utf-8")
        if not text.startswith('{\n "schema":'):  # written before records carried their schema
            text = text.replace("{\n", f'{{\n "schema": {SCHEMA},\n', 1)
        assert (tmp_path / path.name).read_text(encoding="utf-8") == text, path
        if not record.is_lm:
            hyp = path.with_suffix(".hyp.gz")
            assert (tmp_path / hyp.name).read_bytes() == hyp.read_bytes()
            assert len(record.hypotheses) == record.eval.n_sentences
        assert isinstance(record.eval, Perplexity if record.is_lm else Translation)


def test_typed_fields_read_the_layout():
    record = Record.load(CONVERGED)
    data = json.loads(CONVERGED.read_text())
    assert record.run.tying == data["tying"] and record.run.seed == data["seed"]
    assert record.train.stop == Stop(**data["train"]["stop"])
    assert record.train.valid_nll == data["train"]["valid"]["nll_loss"]
    assert record.eval_best.bleu == data["eval_best"]["bleu"]
    assert record.value(("eval_best", "bleu")) == data["eval_best"]["bleu"]
    assert record.train.cpu == data["train"]["cpu"] == "AMD EPYC"
    assert record.value(("train", "continued_from"), optional=True) is None
    with pytest.raises(KeyError, match=r"no train\.continued_from in its record"):
        record.value(("train", "continued_from"))


def test_a_new_key_a_newer_schema_and_a_missing_field_are_refused(tmp_path):
    data = json.loads(CONVERGED.read_text())
    data["train"]["cpu"] = "Intel(R) Xeon(R) Processor, AVX2 kernels"  # known: read
    assert Record.from_dict(data).train.cpu == data["train"]["cpu"]
    for change, message in (({"eval": {**data["eval"], "comet": 0.8}}, r"eval: unknown key"),
                            ({"schema": SCHEMA + 1}, r"schema 2, this fairseq_tying reads"),
                            ({"train": {"params": 1}}, r"train: lacks \['params_trained'")):
        with pytest.raises(ValueError, match=message):
            Record.from_dict({**data, **change}, "r.json")
    (tmp_path / "x.json").write_text(json.dumps(data))
    with pytest.raises(FileNotFoundError, match=r"x\.hyp\.gz: missing"):
        Record.load(tmp_path / "x.json")
    assert Record.load(tmp_path / "x.json", hypotheses=False).hypotheses is None


def test_a_saved_record_reads_back_equal(tmp_path):
    record = Record.load(CONVERGED)
    changed = replace(record, train=replace(record.train, cpu="a processor"),
                      run=replace(record.run, method="m"))
    changed.save(tmp_path / "r.json")
    again = Record.load(tmp_path / "r.json")
    assert again.to_dict() == changed.to_dict() and again.hypotheses == record.hypotheses
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == SCHEMA


def test_the_checkpoint_config_is_read_once_from_cfg_or_legacy_args():
    model = Namespace(arch="transformer_twwt", tying="decoder", output_layer="l2norm")
    state = {"cfg": {"model": model, "common": {"seed": 3},
                     "task": {"_name": "translation", "data": "/d", "source_lang": "es",
                              "target_lang": "en"}}}
    config = CheckpointConfig.of(state)
    assert (config.arch, config.tying, config.output_layer, config.seed, config.task,
            config.data, config.source_lang, config.target_lang) == (
        "transformer_twwt", "decoder", "l2norm", 3, "translation", "/d", "es", "en")
    assert config.model is model
    legacy = CheckpointConfig.of({"args": Namespace(arch="transformer", seed=1, task="lm",
                                                    share_all_embeddings=True,
                                                    tokens_per_sample=64)})
    assert (legacy.arch, legacy.tying, legacy.output_layer, legacy.task,
            legacy.tokens_per_sample) == ("transformer", "three_way", None, "lm", 64)


def _run_folder(run: Path) -> None:
    """A finished, evaluated run as the launcher and ``evaluate`` leave it (no checkpoint)."""
    (run / "logs").mkdir(parents=True)
    valid = {"epoch": 2, "valid_loss": "6.5", "valid_nll_loss": "6.1", "valid_num_updates": "20"}
    (run / "logs" / "train.rank0.log").write_text("\n".join([
        "x | INFO | fairseq_cli.train | num. shared model params: 1,000 (num. trained: 900)",
        f"x | INFO | valid | {json.dumps(valid)}",
        "x | INFO | fairseq_cli.train | done training in 12.5 seconds"]) + "\n")
    (run / "train.done").write_text(json.dumps({"stop": {"epoch": 2, "update": 20,
                                                         "reason": "plateau"},
                                                "finished": "2026-01-02T03:04:05"}))
    (run / "valid_history.json").write_text(json.dumps(
        {"metric": "nll_loss", "epochs": [{"epoch": e, "update": 10 * e, "value": 7.0 - e}
                                          for e in (1, 2)]}))
    (run / "run.json").write_text(json.dumps({"name": "toy.s1", "dataset": "toy", "seed": 1,
                                              "train_args": ["--seed", "1"], "tag": "x"}))
    (run / "test.hyp.en").write_text("a b\nc\n")
    common = {"src": "es", "tgt": "en", "subset": "test", "references": "/refs",
              "references_sha256": "0" * 64, "bleu_signature": "s", "chrf": 40.0,
              "tok_bleu": 21.0, "run": {"name": "toy.s1", "method": "m", "arch": "a",
                                        "tying": "none", "output_layer": "dot", "seed": 1}}
    (run / "eval.json").write_text(json.dumps({**common, "bleu": 20.0, "averaged": ["c1.pt"],
                                               "checkpoint": str(run / "c.avg.pt"),
                                               "hypotheses": "test.hyp.en"}))
    (run / "eval.best.json").write_text(json.dumps({**common, "bleu": 19.0, "tag": "best",
                                                    "checkpoint": "/x/checkpoint_best.pt",
                                                    "hypotheses": "test.hyp.en"}))


def test_one_builder_makes_the_study_record_and_collects_scores(tmp_path):
    run = tmp_path / "runs" / "toy.s1"
    _run_folder(run)
    with pytest.raises(FileNotFoundError, match="--without-row-norms"):
        build_record(run)
    record = build_record(run, row_norms=False)
    assert (record.name, record.run.method, record.run.dataset, record.run.tag) == (
        "toy.s1", "m", "toy", "x")  # a tagged grid block's run: its cell is "dot+x"
    saved = Record.load(record.save(tmp_path / "toy.s1.json"))
    assert saved.run.tag == "x" and saved.run.cell_layer() == "dot+x"
    assert "task" not in json.loads((tmp_path / "toy.s1.json").read_text())
    assert record.checkpoint == "c.avg.pt" and record.output_row_norms is None
    assert (record.train.params, record.train.params_trained, record.train.train_seconds) == (
        1000, 900, 12.5)
    assert record.train.valid_history == [[20, 6.1]] and record.train.valid_nll == 6.1
    assert record.train.stop == Stop(epoch=2, reason="plateau", update=20)
    assert record.train.date == "2026-01-02"  # no rank file: the day train.done was written
    assert record.train.valid_epochs == [[1, 10, 6.0], [2, 20, 5.0]]
    assert (record.eval.bleu, record.eval.averaged, record.eval_best.bleu,
            record.eval_best.checkpoint) == (20.0, ["c1.pt"], 19.0, "checkpoint_best.pt")
    assert record.hypotheses == ["a b", "c"]
    assert export(tmp_path / "runs", tmp_path / "records", row_norms=False) == ["toy.s1"]
    again = Record.load(tmp_path / "records" / "toy.s1.json")
    assert again.to_dict() == record.to_dict() and again.hypotheses == record.hypotheses
    scores = build_record(run, scores_only=True)  # collect's: the same record, no training
    assert scores.train is None
    assert scores.to_dict() == {k: v for k, v in record.to_dict().items() if k != "train"}


def test_the_records_evaluation_types_are_the_evaluations_less_what_a_record_leaves_out():
    """A field added to evaluation/result.py's types is recorded without a second edit."""
    for part, result in ((Translation, TranslationResult), (Perplexity, PerplexityResult)):
        assert {f.name for f in fields(part)} == {f.name for f in fields(result)} - NOT_RECORDED
        assert all(f.default is None for f in fields(part))
