"""The language models (``transformer_lm_tied*``): tying by tensor identity, every output layer
against an independent formula, tied+L (H ≠ D), incremental decoding against the full pass,
parameter counts, and the errors for what a decoder-only model cannot do."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
import torch

from fairseq_tying.common import PLUGIN_DIR
from fairseq_tying.core import output_layers, scoring
from tests.helpers import LM_TRAIN, build_lm, reference_scores, run_cli


def test_decoder_tying_is_one_tensor_and_none_is_two(lm_bin):
    tied, _ = build_lm(lm_bin)
    assert tied.decoder.embed_tokens.weight is tied.decoder.scorer.weight
    untied, _ = build_lm(lm_bin, "--tying", "none")
    assert untied.decoder.embed_tokens.weight is not untied.decoder.scorer.weight
    assert untied.decoder.embed_tokens.weight.data_ptr() != untied.decoder.scorer.weight.data_ptr()


def test_decoder_tying_saves_exactly_one_matrix(lm_bin):
    def count(model):
        return sum(p.numel() for p in model.parameters())

    tied, task = build_lm(lm_bin)
    untied, _ = build_lm(lm_bin, "--tying", "none")
    assert count(untied) - count(tied) == len(task.source_dictionary) * 16


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_scores_follow_the_output_layer_formula(lm_bin, output_layer):
    model, task = build_lm(lm_bin, "--output-layer", output_layer)
    h = torch.randn(4, 16)
    rows = [i for i in range(len(task.source_dictionary)) if i != task.source_dictionary.pad()]
    learned = {name: p.detach()[rows] if p.dim() else p
                for name, p in model.decoder.scorer.layer_parameters().items()}
    want = reference_scores(output_layer, h, model.decoder.embed_tokens.weight.detach()[rows],
                            **learned)
    got = model.decoder.output_layer(h).double()[:, rows]  # the zero padding row scores 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_l2norm_normalizes_the_input_lookup(lm_bin):
    model, _ = build_lm(lm_bin, "--output-layer", "l2norm", "--no-scale-embedding")
    tokens = torch.tensor([[4, 5, 6]])
    w = model.decoder.embed_tokens.weight
    torch.testing.assert_close(model.decoder.embed_tokens(tokens), scoring.unit_rows(w[tokens]))


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_incremental_decoding_equals_full_forward(lm_bin, output_layer):
    torch.manual_seed(0)
    model, task = build_lm(lm_bin, "--output-layer", output_layer, "--tied-projection",
                           "--tied-embed-dim", "8")
    model.eval()
    d = task.target_dictionary
    prev = torch.cat([torch.full((2, 1), d.eos()), torch.randint(d.nspecial, len(d), (2, 5))], 1)
    with torch.no_grad():
        full, _ = model.decoder(prev)
        state: dict = {}
        steps = [model.decoder(prev[:, : t + 1], incremental_state=state)[0]
                 for t in range(prev.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)


def test_tied_plus_l_maps_the_hidden_size_to_the_matrix_width(lm_bin):
    """Gulordava et al.'s tied+L: H = 16, D = 8; s = rule(L·h, W) with L learned (8×16)."""
    model, task = build_lm(lm_bin, "--output-layer", "cosine", "--tied-projection",
                           "--tied-embed-dim", "8")
    scorer = model.decoder.scorer
    assert scorer.weight is model.decoder.embed_tokens.weight
    assert scorer.weight.shape == (len(task.source_dictionary), 8)
    assert scorer.projection.weight.shape == (8, 16)
    h = torch.randn(3, 16)
    torch.testing.assert_close(model.decoder.output_layer(h),
                               output_layers.scores("cosine", scorer.projection(h), scorer.weight))


@pytest.mark.parametrize(("flags", "message"), [
    (("--tying", "three_way"), "no encoder"),
    (("--tied-embed-dim", "8"), "--tied-projection"),
    (("--adaptive-input",), "--adaptive-input"),
    (("--adaptive-softmax-cutoff", "10"), "--adaptive-softmax-cutoff"),
])
def test_what_a_language_model_cannot_do_is_refused_by_name(lm_bin, flags, message):
    with pytest.raises(ValueError, match=message):
        build_lm(lm_bin, *flags)


@pytest.mark.parametrize(("arch", "layers", "dim"), [
    ("transformer_lm_tied", 6, 512),
    ("transformer_lm_tied_big", 12, 1024),
    ("transformer_lm_tied_gpt", 12, 768),
])
def test_presets_mirror_fairseqs(arch, layers, dim):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.decoder_layers, args.decoder_embed_dim) == (layers, dim)
    assert (args.tying, args.output_layer) == ("decoder", "dot")


# ---- through fairseq's LM tools: fairseq-train, fairseq-eval-lm, fairseq-interactive ----
# (the trained models: conftest's trained_lms)


def independent_test_loss(checkpoint: Path, data: Path) -> float:
    """Mean negative log2-likelihood of the test tokens, computed here from the model's
    scores (log-softmax and gather), blocks as fairseq-eval-lm reads them."""
    from fairseq import checkpoint_utils

    import fairseq_tying  # noqa: F401

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    model = models[0].eval()
    task.load_dataset("test")
    total, count = 0.0, 0
    with torch.no_grad():
        for item in task.dataset("test"):
            scores, _ = model(item["source"][None])
            logp = torch.log_softmax(scores.double(), -1)[0]
            total -= logp.gather(-1, item["target"][:, None]).sum().item()
            count += item["target"].numel()
    return total / count / torch.log(torch.tensor(2.0)).item()


@pytest.mark.slow
@pytest.mark.parametrize("output_layer", output_layers.names())
def test_eval_lm_perplexity_equals_an_independent_computation(trained_lms, lm_bin,
                                                              output_layer):
    ckpt = trained_lms(output_layer)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["cfg"]["model"].output_layer == output_layer
    proc = run_cli("fairseq-eval-lm", str(lm_bin), "--path", str(ckpt), "--user-dir",
                   PLUGIN_DIR, "--gen-subset", "test", "--cpu", "--max-tokens", "512",
                   "--tokens-per-sample", "32")  # blocks as in training (fairseq's default 1024)
    line = next(x for x in proc.stderr.splitlines() if "Loss (base 2)" in x)
    loss = float(line.split("Loss (base 2): ")[1].split(",")[0])
    ppl = float(line.split("Perplexity: ")[1])
    assert loss == pytest.approx(independent_test_loss(ckpt, lm_bin), abs=2e-4)
    assert ppl == pytest.approx(2**loss, rel=1e-3)
    assert ppl < len((lm_bin / "dict.txt").read_text().splitlines())  # better than uniform


@pytest.mark.slow
def test_resuming_with_another_output_layer_is_refused(trained_lms, lm_bin):
    ckpt = trained_lms("l2norm")
    proc = run_cli("fairseq-train", str(lm_bin), "--arch", "transformer_lm_tied",
                   "--output-layer", "dot", "--save-dir", str(ckpt.parent), *LM_TRAIN,
                   check=False)
    assert proc.returncode != 0
    assert "--output-layer l2norm" in proc.stderr and "--output-layer dot" in proc.stderr


@pytest.mark.slow
def test_interactive_sampling_continues_the_prompt(trained_lms, lm_bin):
    ckpt = trained_lms("sqnorm")

    def sample() -> list[str]:
        proc = run_cli(
            "fairseq-interactive", str(lm_bin), "--task", "language_modeling",
            "--path", str(ckpt), "--user-dir", PLUGIN_DIR, "--cpu", "--sampling",
            "--sampling-topk", "5", "--beam", "1", "--nbest", "1", "--seed", "3",
            "--max-len-b", "8", input="W1 W2\n")
        return [x for x in proc.stdout.splitlines() if x.startswith("H-")]

    first = sample()
    assert len(first) == 1
    tokens = first[0].split("\t")[2].split()
    vocab = {x.split()[0] for x in (lm_bin / "dict.txt").read_text().splitlines()}
    assert tokens[:2] == ["W1", "W2"] and len(tokens) > 2
    assert set(tokens) <= vocab | {"<unk>", "</s>"}
    assert sample() == first  # the same seed samples the same continuation
