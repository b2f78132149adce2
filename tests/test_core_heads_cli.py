"""``--output-layer softcap``, ``--output-layer ngpt``, a transform layer registered from one file
and ``--z-loss`` through fairseq's real tools: fairseq-train with fairseq's loss and the chunked
one (the same logs), resuming (and refusing another --softcap), fairseq-generate, checkpoint
averaging, and the exports (CTranslate2 applies softcap's cap: its scores are fairseq's; every
other refusal names the layer)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from fairseq_tying.evaluation.average import average_checkpoints
from fairseq_tying.export.ct2 import Subword, export_ct2
from tests.helpers import (
    TOY_TRANSFORM,
    TOY_TRANSFORM_FILE,
    assert_same_logs,
    decode,
    generate,
    last_updates,
    run_cli,
    run_module,
    toy_env,
    train_args,
    train_both,
    translation_args,
)

pytestmark = pytest.mark.slow  # every test runs fairseq's CLI


@pytest.mark.parametrize("flags", [
    ("--output-layer", "softcap", "--softcap", "2"),
    ("--output-layer", "ngpt"),
    ("--output-layer", "dot", "--z-loss", "0.01"),
    ("--output-layer", "ngpt", "--z-loss", "0.01"),
], ids=["softcap", "ngpt", "dot-zloss", "ngpt-zloss"])
def test_fairseq_trains_it_the_same_with_either_loss(joined_bin, tmp_path, flags):
    want, got = train_both(*translation_args(joined_bin, tmp_path, "transformer_twwt", *flags))
    assert_same_logs(want, got)
    inner = [record for kind, record in want if kind == "train_inner"]
    assert all(("z_loss" in r) == ("--z-loss" in flags) for r in inner)
    if "--z-loss" in flags:  # its own term, inside the loss
        assert all(0 < float(r["z_loss"]) < float(r["loss"]) for r in inner)
    assert all(("sz" in r) == ("ngpt" in flags) for r in inner)  # logged by name (its mean)


def test_a_transform_layer_from_one_file_trains_the_same_with_either_loss_and_decodes(
        joined_bin, tmp_path):
    env = toy_env(TOY_TRANSFORM_FILE)
    want, got = train_both(*translation_args(joined_bin, tmp_path, "transformer_twwt",
                                             "--output-layer", TOY_TRANSFORM), env=env)
    assert_same_logs(want, got)
    run_cli("fairseq-train", *train_args(joined_bin, tmp_path, "transformer_twwt",
                                         "--output-layer", TOY_TRANSFORM), env=env)
    decoded = decode(joined_bin, tmp_path / "checkpoint_last.pt", "--user-dir", "fairseq_tying",
                     env=env)
    assert len(decoded.hypotheses) >= 16
    proc = run_module("fairseq_tying.export", tmp_path / "checkpoint_last.pt", tmp_path / "ct2",
                      "--format", "ctranslate2", check=False, env=env)
    assert proc.returncode == 2
    assert (f"--output-layer {TOY_TRANSFORM} passes its scores through an element-wise "
            "transform (SoftplusDot.transform), which CTranslate2's decoder cannot compute"
            in proc.stderr)


@pytest.mark.parametrize("output_layer", ["softcap", "ngpt"])
def test_train_resume_decode_average_and_export(joined_bin, tmp_path, output_layer):
    args = train_args(joined_bin, tmp_path, "transformer_twwt", "--output-layer", output_layer,
                      "--softcap", "2")
    proc = run_cli("fairseq-train", *args)
    assert last_updates(proc.stdout + proc.stderr) == 4
    shutil.copyfile(tmp_path / "checkpoint_last.pt", tmp_path / "first.pt")
    first = torch.load(tmp_path / "first.pt", weights_only=True)
    resumed = run_cli("fairseq-train", *args, "--max-update", "8")  # the last one counts
    assert last_updates(resumed.stdout + resumed.stderr) == 8
    last = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert last["cfg"]["model"].softcap == 2.0
    if output_layer == "ngpt":  # a vector of V values, trained on and saved
        sz = last["model"]["decoder.scorer.sz"]
        assert sz.shape == last["model"]["decoder.scorer.weight"].shape[:1]
        assert not torch.equal(sz, first["model"]["decoder.scorer.sz"])
    else:  # the cap is the model's: another is refused on resume
        proc = run_cli("fairseq-train", *args, "--softcap", "5", "--max-update", "9",
                       check=False)
        assert proc.returncode != 0
        assert "was trained with --softcap 2.0, but this run asks for --softcap 5.0" in \
            proc.stderr
    assert len(generate(joined_bin, tmp_path / "checkpoint_last.pt", "--beam", "4")) == 20
    ckpts = [tmp_path / "first.pt", tmp_path / "checkpoint_last.pt"]
    averaged = average_checkpoints(ckpts, tmp_path / "averaged.pt")
    states = [torch.load(p, weights_only=True)["model"] for p in ckpts]
    mean = torch.load(averaged, weights_only=True)["model"]
    for key in ("decoder.scorer.weight", *(["decoder.scorer.sz"] * (output_layer == "ngpt"))):
        torch.testing.assert_close(mean[key], (states[0][key] + states[1][key]) / 2)
    assert len(generate(joined_bin, averaged, "--beam", "4")) == 20
    for fmt in ("fairseq", "ctranslate2"):
        out = tmp_path / fmt
        proc = run_module("fairseq_tying.export", tmp_path / "checkpoint_last.pt", out,
                          "--format", fmt, *(["--no-subword"] if fmt == "ctranslate2" else []),
                          check=False)
        refused = output_layer == "ngpt" or fmt == "fairseq"
        assert proc.returncode == (2 if refused else 0), proc.stderr[-2000:]
        if refused:
            assert f"--output-layer {output_layer} " in proc.stderr and not out.exists()


def test_ctranslate2_applies_softcaps_cap(trained, joined_bin, tmp_path):
    """A model trained with c = 2 (its scores capped hard): CTranslate2's scores of
    fairseq-generate's hypotheses are fairseq's, which a model without the cap does not give."""
    import ctranslate2

    run = trained("transformer_twwt", "three_way", "softcap", False, ("--softcap", "2"))
    uncapped = decode(joined_bin, run.ckpt, "--user-dir", "fairseq_tying",
                      "--model-overrides", "{'softcap': 1000.0}")
    out = tmp_path / "ct2"
    meta = export_ct2(run.ckpt, out, subword=Subword("none"))
    assert meta["output_layer"] == "softcap"
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    ids = sorted(run.hypotheses)
    scored = translator.score_batch([run.sources[i] for i in ids],
                                    [run.hypotheses[i].split() for i in ids])
    got = {i: sum(r.log_probs) / math.log(2) for i, r in zip(ids, scored, strict=True)}
    want = run.decoded.scores  # base 2, length penalty 0: the hypothesis's log-probability
    assert all(abs(got[i] - want[i]) < 1e-3 * max(1, abs(want[i])) for i in ids)
    changed = [i for i in ids if uncapped.hypotheses[i] == run.hypotheses[i]
               and abs(uncapped.scores[i] - want[i]) > 0.05]
    assert len(changed) >= len(ids) // 2  # the cap moves the scores it reproduces
