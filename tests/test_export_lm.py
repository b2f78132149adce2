"""Export of the language models to fairseq's stock ``transformer_lm``: stock fairseq-eval-lm
(no --user-dir) on the export gives the plugin checkpoint's loss, the export's scores equal the
plugin's, shared rows stay one tensor, tied+L becomes fairseq's project_out_dim, and what stock
cannot express is refused by name."""

from __future__ import annotations

import dataclasses
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fairseq_tying import export, translate
from fairseq_tying.core import output_layers
from fairseq_tying.export.stock import PLUGIN_ARCHS, bake_lm, stock_arch, stock_lm_arch
from tests.helpers import build_on_meta, run_cli, run_module

TIED_L = ("--tied-embed-dim", "8", "--tied-projection")  # D = 8 under H = 16
CASES = {  # name: (--output-layer, extra fairseq-train flags)
    "dot": ("dot", ()),
    "l2norm": ("l2norm", ()),
    "sqnorm": ("sqnorm", ()),
    "cosine": ("cosine", ()),
    "none-l2norm-vectors": ("l2norm", ("--tying", "none")),  # + --decoder-embed-path
    "tiedL-l2norm": ("l2norm", TIED_L),
}
LM = ("--task", "language_modeling")
NO_VECTORS = ("--model-overrides", "{'decoder_embed_path': None}")


@pytest.fixture(scope="module")
def vectors(lm_bin, tmp_path_factory) -> Path:
    """Pretrained vectors (fairseq's text format, D = 16) for every dictionary word."""
    words = [line.split()[0] for line in (lm_bin / "dict.txt").read_text().splitlines()]
    g = torch.Generator().manual_seed(5)
    rows = [f"{w} " + " ".join(f"{x:.5f}" for x in torch.randn(16, generator=g).tolist())
            for w in words]
    path = tmp_path_factory.mktemp("vectors") / "vectors.txt"
    path.write_text(f"{len(rows)} 16\n" + "\n".join(rows) + "\n")
    return path


def _checkpoint(trained_lms, vectors: Path, case: str) -> Path:
    output_layer, flags = CASES[case]
    if case.endswith("vectors"):
        flags = (*flags, "--decoder-embed-path", str(vectors))
    return trained_lms(output_layer, *flags)


def _eval_lm(data: Path, ckpt: Path, *extra: str) -> tuple[float, float]:
    proc = run_cli("fairseq-eval-lm", str(data), "--path", str(ckpt), "--gen-subset", "test",
                   "--cpu", "--max-tokens", "512", "--tokens-per-sample", "32", *extra)
    line = next(x for x in proc.stderr.splitlines() if "Loss (base 2)" in x)
    return (float(line.split("Loss (base 2): ")[1].split(",")[0]),
            float(line.split("Perplexity: ")[1]))


def _load(ckpt: Path, data: Path):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(ckpt)], arg_overrides={"data": str(data), "decoder_embed_path": None})
    return models[0].eval(), task


def _log_probs(model, task) -> torch.Tensor:
    task.load_dataset("test")
    with torch.no_grad():
        return torch.cat([torch.log_softmax(model(item["source"][None])[0].double(), -1)[0]
                          for item in task.dataset("test")])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_stock_eval_lm_reproduces_the_plugin(trained_lms, vectors, lm_bin, tmp_path, case,
                                             capsys):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    ckpt = _checkpoint(trained_lms, vectors, case)
    out = tmp_path / "stock.pt"
    assert export.main([str(ckpt), str(out)]) == 0
    assert "arch transformer_lm;" in capsys.readouterr().out

    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(out)) == []
    state = torch.load(out, weights_only=True)
    cfg, weights = state["cfg"]["model"], state["model"]
    assert cfg["arch"] == cfg["_name"] == "transformer_lm" and cfg["user_dir"] is None
    assert cfg["decoder_embed_path"] is None and "output_layer" not in cfg
    assert not any(k.startswith("decoder.scorer") for k in weights)
    output_layer, _ = CASES[case]
    shared = output_layer in ("dot", "l2norm") and "none" not in case
    assert cfg["share_decoder_input_output_embed"] is shared
    same_storage = (weights["decoder.embed_tokens.weight"].untyped_storage().data_ptr()
                    == weights["decoder.output_projection.weight"].untyped_storage().data_ptr())
    assert same_storage is shared  # one tensor in the file where the rule shares the rows
    if case.startswith("tiedL"):  # L is fairseq's project_out_dim: H = 16 -> D = 8
        assert (cfg["decoder_input_dim"], cfg["decoder_output_dim"]) == (8, 8)
        assert weights["decoder.project_out_dim.weight"].shape == (8, 16)
        assert weights["decoder.output_projection.weight"].shape[1] == 8

    stock, task = _load(out, lm_bin)
    assert type(stock) is TransformerLanguageModel  # fairseq's own class, no plugin module
    decoder = stock.decoder
    assert (decoder.output_projection.weight is decoder.embed_tokens.weight) is shared
    plugin, _ = _load(ckpt, lm_bin)
    torch.testing.assert_close(_log_probs(stock, task), _log_probs(plugin, task),
                               rtol=1e-5, atol=1e-5)

    plugin_flags = NO_VECTORS if case.endswith("vectors") else ()
    ours = _eval_lm(lm_bin, ckpt, "--user-dir", "fairseq_tying", *plugin_flags)
    if case.endswith("vectors"):
        vectors.unlink()  # stock fairseq must not need the file
    theirs = _eval_lm(lm_bin, out)  # no --user-dir: fairseq never imports the plugin
    assert theirs[0] == pytest.approx(ours[0], abs=1e-4)
    assert theirs[1] == pytest.approx(ours[1], rel=1e-4)


@pytest.mark.slow
def test_distance_is_refused_and_nothing_is_written(trained_lms, tmp_path):
    out = tmp_path / "stock" / "model.pt"
    proc = run_module("fairseq_tying.export", trained_lms("distance"), out, check=False)
    assert proc.returncode == 2
    assert "--output-layer distance" in proc.stderr and "bias" in proc.stderr
    assert "transformer_lm" in proc.stderr and "--format ctranslate2" in proc.stderr
    assert not out.exists() and not out.parent.exists()


# name: (--output-layer, flags); each exercises one way of reaching CTranslate2's decoder
CT2_CASES = {
    "dot": ("dot", ()),
    "distance-bias": ("distance", ("--output-bias",)),  # a bias on the output projection
    "none-sqnorm": ("sqnorm", ("--tying", "none")),
    "tiedL-l2norm": ("l2norm", TIED_L),  # project_in_dim alone: identity project_out
    "wideH-cosine": ("cosine", ("--decoder-output-dim", "24", "--tied-projection")),  # folded
    "softcap": ("softcap", ("--softcap", "1.5")),  # the decoder's final_logit_softcapping
}


def _ct2_scores(generator, d, rows: list[list[int]]) -> list[list[float]]:
    results = generator.score_batch([[d[i] for i in row] for row in rows])
    return [list(r.log_probs) for r in results]


def _greedy(model, eos: int, prompt: list[int], steps: int) -> list[int]:
    """Greedy continuation by full forward passes of the plugin model (no cache)."""
    ids = [eos, *prompt]
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([ids]))[0][0, -1].argmax())
            if token == eos:
                break
            ids.append(token)
    return ids[1 + len(prompt):]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CT2_CASES))
def test_ctranslate2_generator_reproduces_the_plugin(trained_lms, lm_bin, tmp_path, case):
    """The CTranslate2 export scores every test token with the plugin's log-probability and
    continues prompts greedily as the plugin does, for each route into CTranslate2's decoder."""
    import ctranslate2

    output_layer, flags = CT2_CASES[case]
    ckpt = trained_lms(output_layer, *flags)
    out = tmp_path / "ct2"
    assert export.main([str(ckpt), str(out), "--format", "ctranslate2", "--no-subword"]) == 0
    meta = json.loads((out / "fairseq_tying.json").read_text())
    assert (meta["task"], meta["output_bias"]) == ("language_modeling", case == "distance-bias")
    plugin, task = _load(ckpt, lm_bin)
    decoder = plugin.decoder
    projections = (decoder.project_in_dim is not None, decoder.project_out_dim is not None)
    assert projections == {"tiedL-l2norm": (True, False),
                           "wideH-cosine": (False, True)}.get(case, (False, False))

    d = task.dictionary
    task.load_dataset("test")
    rows = [[d.eos(), *task.dataset("test")[i]["target"].tolist()] for i in range(3)]
    want = []
    with torch.no_grad():
        for row in rows:
            lprobs = torch.log_softmax(plugin(torch.tensor([row[:-1]]))[0][0].double(), -1)
            want.append(lprobs.gather(-1, torch.tensor(row[1:])[:, None])[:, 0].tolist())
    generator = ctranslate2.Generator(str(out), device="cpu", intra_threads=1)
    for got, ref in zip(_ct2_scores(generator, d, rows), want, strict=True):
        assert got == pytest.approx(ref, abs=1e-4)

    prompts = [row[1:4] for row in rows]
    results = generator.generate_batch([[d[i] for i in [d.eos(), *p]] for p in prompts],
                                       max_length=8, sampling_topk=1,
                                       include_prompt_in_result=False)
    for prompt, result in zip(prompts, results, strict=True):
        assert [d.index(t) for t in result.sequences[0]] == _greedy(plugin, d.eos(), prompt, 8)

    assert translate.main(["--model", str(out)]) == 2  # a Translator cannot load it


@pytest.mark.slow
def test_serve_bench_scores_a_language_model_as_fairseq_eval_lm(trained_lms, lm_bin, tmp_path):
    """bench --mode serve on an LM: fairseq's side is fairseq-eval-lm's loss, CTranslate2's
    float32 the same perplexity, int8 close to it; the report is written as JSON."""
    from fairseq_tying.bench import serve

    ckpt = trained_lms("distance", "--output-bias")
    report = serve.main(["--checkpoint", str(ckpt), "--batch-size", "4",
                         "--out", str(tmp_path / "lm.json")])
    rows = report["results"]
    loss, ppl = _eval_lm(lm_bin, ckpt, "--user-dir", "fairseq_tying")
    fairseq = rows["fairseq"]
    assert -fairseq["log_prob"] / fairseq["tokens"] / math.log(2) == pytest.approx(loss, abs=1e-4)
    assert fairseq["perplexity"] == pytest.approx(ppl, abs=0.006)
    assert rows["ct2_float32"]["perplexity"] == pytest.approx(fairseq["perplexity"], rel=1e-5)
    assert rows["ct2_int8"]["perplexity"] == pytest.approx(fairseq["perplexity"], rel=0.05)
    assert json.loads((tmp_path / "lm.json").read_text())["task"] == "language_modeling"


def test_word_level_data_needs_no_subword_model(tmp_path):
    """A word-level LM set (prep.json: subword word) exports for whitespace-split text."""
    from fairseq_tying.export.ct2 import Subword, find_subword

    (tmp_path / "bin").mkdir()
    (tmp_path / "prep.json").write_text(json.dumps({"subword": "word"}))
    assert find_subword(tmp_path / "bin") == Subword("none")
    (tmp_path / "prep.json").write_text(json.dumps({"subword": "sentencepiece"}))
    with pytest.raises(export.ExportError, match="--no-subword"):
        find_subword(tmp_path / "bin")  # its spm.model is missing


def _lm_args(**kw) -> Namespace:
    base = {"arch": "transformer_lm_tied", "output_layer": "dot", "tying": "decoder",
            "tied_projection": False, "tied_embed_dim": 8, "output_bias": False,
            "decoder_embed_dim": 16}
    return Namespace(**{**base, **kw})


def test_output_bias_is_refused_by_name():
    import fairseq_tying  # noqa: F401  (registers the archs)

    families = tuple(PLUGIN_ARCHS)
    assert stock_arch(_lm_args(), formats=families) == "transformer_lm"  # D = 8 < 16 is fine
    with pytest.raises(export.ExportError, match="--output-bias .*transformer_lm") as e:
        stock_arch(_lm_args(output_bias=True), formats=families)
    assert "--format ctranslate2" in str(e.value)  # CTranslate2 has an output bias


def _stock_build(task, model_cfg):
    """What stock fairseq builds from a saved model config (as when loading a checkpoint)."""
    from fairseq.models import build_model
    from omegaconf import OmegaConf

    with torch.device("meta"):
        return build_model(OmegaConf.create(model_cfg), task, from_checkpoint=True)


def _unnamed(value):
    """A config without its ``_name`` entries (the arch's name, copied into every group)."""
    if isinstance(value, dict):
        return {k: _unnamed(v) for k, v in value.items() if k != "_name"}
    return value


def _anatomy(model) -> tuple[dict, dict]:
    """(the decoder's built config, the parameter shapes) of a transformer LM."""
    return (_unnamed(dataclasses.asdict(model.decoder.cfg)),
            {k: tuple(v.shape) for k, v in model.state_dict().items()})


@pytest.mark.parametrize(("arch", "stock"), [("transformer_lm_tied", "transformer_lm"),
                                             ("transformer_lm_tied_big", "transformer_lm_big"),
                                             ("transformer_lm_tied_gpt", "transformer_lm_gpt")])
@pytest.mark.parametrize("flags", [(), ("--decoder-embed-dim", "192")])
def test_presets_export_to_the_model_stock_fairseq_trains(lm_bin, arch, stock, flags):
    """A decoder-tied ``dot`` LM of each preset is, and exports as, the model of fairseq-train
    ``--arch <stock preset> --share-decoder-input-output-embed`` with the same flags: the same
    built config (norm placement, embedding widths, every other field) and parameter shapes."""
    from fairseq_tying.export.stock import stock_cfg

    assert stock_lm_arch(arch) == stock
    task, _, want = build_on_meta(lm_bin, stock, *LM, "--share-decoder-input-output-embed", *flags)
    _, args, model = build_on_meta(lm_bin, arch, *LM, "--output-layer", "dot", *flags)
    assert _anatomy(model)[0] == _anatomy(want)[0]
    _, export_flags = bake_lm(model.state_dict(), args)
    exported = stock_cfg({"model": None}, args, export_flags, stock)["model"]
    assert _anatomy(_stock_build(task, exported)) == _anatomy(want)


def test_configs_trained_before_the_stock_defaults_still_export(lm_bin):
    """transformer_lm_tied checkpoints of earlier versions hold base_lm_architecture's
    ``base_shuffle=False``; stock's dataclass refuses a bool there, so the export writes 0."""
    from fairseq_tying.export.stock import stock_cfg

    task, _, want = build_on_meta(lm_bin, "transformer_lm", *LM,
                                  "--share-decoder-input-output-embed")
    _, args, model = build_on_meta(lm_bin, "transformer_lm_tied", *LM, "--output-layer", "dot")
    args.base_shuffle = False
    exported = stock_cfg({"model": None}, args, bake_lm(model.state_dict(), args)[1],
                         "transformer_lm")["model"]
    assert exported["base_shuffle"] == 0 and type(exported["base_shuffle"]) is int
    assert _stock_build(task, exported).decoder.cfg.base_shuffle == 0


def _decoder(w_in: Tensor, w: Tensor, projection: Tensor, out: Tensor | None) -> dict:
    state = {"decoder.embed_tokens.weight": w_in, "decoder.scorer.weight": w,
             "decoder.scorer.projection.weight": projection}
    if out is not None:
        state["decoder.project_out_dim.weight"] = out
    return state


def test_tied_l_becomes_project_out_dim_or_folds_into_the_output_matrix():
    """s = sqnorm(L·P_out·x, W) for the model-size output x (M = 6): with D = 4 ≠ M, stock's
    project_out_dim is L·P_out and the output matrix W/‖w‖²; with an untied V×H matrix of
    width H = M, L folds into the output matrix and P_out stays (here H = M, no P_out)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, generator=g)

    def stock_scores(new: dict) -> Tensor:
        h = x
        if "decoder.project_out_dim.weight" in new:
            h = h @ new["decoder.project_out_dim.weight"].T
        return h @ new["decoder.output_projection.weight"].T

    w, proj, out = torch.randn(10, 4, generator=g), torch.randn(4, 5, generator=g), \
        torch.randn(5, 6, generator=g)  # D = 4, H = 5, M = 6
    new, flags = bake_lm(_decoder(w, w, proj, out), _lm_args(output_layer="sqnorm",
                                                           decoder_embed_dim=6))
    want = output_layers.scores("sqnorm", (x @ out.T) @ proj.T, w)
    torch.testing.assert_close(stock_scores(new), want)
    assert flags == {"share_decoder_input_output_embed": False, "decoder_input_dim": 4,
                     "decoder_output_dim": 4}

    w_out = torch.randn(10, 6, generator=g)  # --tying none: the V×H output matrix, H = M = 6
    proj = torch.randn(6, 6, generator=g)
    new, flags = bake_lm(_decoder(w, w_out, proj, None),
                         _lm_args(output_layer="cosine", tying="none", decoder_embed_dim=6))
    torch.testing.assert_close(stock_scores(new), output_layers.scores("cosine", x @ proj.T, w_out))
    assert "decoder.project_out_dim.weight" not in new
    assert flags["decoder_output_dim"] == 6 and flags["decoder_input_dim"] == 4
    torch.testing.assert_close(new["decoder.embed_tokens.weight"], w)  # none: raw input rows
