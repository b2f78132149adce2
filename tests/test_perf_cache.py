"""Inference caches of the normalized matrices: never stale, shared, released; and the
benchmark end to end at the tiny size (not a timing test)."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch

from fairseq_tying.bench import layers
from fairseq_tying.core import modules, output_layers, scoring
from tests.helpers import build_model, run_module


def _model(data, output_layer: str):
    model, task = build_model(data, "transformer_twwt", "--output-layer", output_layer)
    return model.eval(), task


def _fresh(scorer, h):
    return output_layers.scores(scorer.output_layer, h, scorer.weight, gain=scorer.gain)


@pytest.mark.parametrize("output_layer", ["sqnorm", "distance"])
def test_a_reused_storage_address_is_not_taken_for_the_cached_weight(joined_bin, output_layer):
    """``param.data = ...`` keeps the version counter; the new storage may land at the freed
    address of the old one. The cache pins the old storage, so the address cannot repeat."""
    model, _ = _model(joined_bin, output_layer)
    scorer, h = model.decoder.scorer, torch.randn(2, 16)
    with torch.no_grad():
        scorer(h)
        weight = scorer.weight
        weight.data = weight.data.clone()
        weight.data = torch.full_like(weight.data, 0.5)
        torch.testing.assert_close(scorer(h), _fresh(scorer, h), rtol=0, atol=0)


@pytest.mark.parametrize("output_layer", ["l2norm", "cosine", "sqnorm", "distance"])
def test_dtype_round_trips_never_reuse_the_cache(joined_bin, output_layer):
    model, _ = _model(joined_bin, output_layer)
    scorer, h = model.decoder.scorer, torch.randn(2, 16)
    with torch.no_grad():
        scorer(h)
        model.half()
        w_out, _ = scorer.output_matrix_and_bias()
        assert w_out.dtype == torch.float16
        model.to(torch.float64)
        torch.testing.assert_close(scorer(h.double()), _fresh(scorer, h.double()), rtol=0, atol=0)
        model.float()  # fp32 again, possibly at the first fp32 address, same version counter
        torch.testing.assert_close(scorer(h), _fresh(scorer, h), rtol=0, atol=0)


def test_l2norm_lookups_share_the_scorers_cached_matrix(joined_bin):
    model, task = _model(joined_bin, "l2norm")
    embed, scorer = model.decoder.embed_tokens, model.decoder.scorer
    tokens = torch.tensor([[5, 6, task.target_dictionary.pad(), 7]])
    with torch.no_grad():
        looked_up = embed(tokens)
        w_out, _ = scorer.output_matrix_and_bias()
        unit, _ = modules.cached_output_matrix_and_bias("l2norm", embed.weight)
        torch.testing.assert_close(looked_up, scoring.unit_rows(embed.weight[tokens]))
        assert unit is w_out  # one extra V x D buffer, not one per role
        assert looked_up[0, 2].abs().sum() == 0  # the padding row stays zero
        embed.weight.add_(1.0)  # in place: version bump
        torch.testing.assert_close(embed(tokens), scoring.unit_rows(embed.weight[tokens]))


def test_train_releases_the_cached_matrices(joined_bin):
    model, _ = _model(joined_bin, "cosine")
    weight = model.decoder.scorer.weight
    with torch.no_grad():
        cached = weakref.ref(model.decoder.scorer.output_matrix_and_bias()[0])
    assert cached() is not None and (id(weight), "cosine") in modules._entries
    model.train()
    gc.collect()
    assert (id(weight), "cosine") not in modules._entries
    assert cached() is None  # nothing (the scorer included) holds the V x D matrix any more


@pytest.mark.parametrize("output_layer", ["l2norm", "distance"])
def test_a_deleted_model_takes_its_cache_with_it(joined_bin, output_layer):
    model, _ = _model(joined_bin, output_layer)
    weight_id = id(model.decoder.scorer.weight)
    with torch.no_grad():
        model.decoder.scorer(torch.randn(2, 16))
    alive = weakref.ref(model.decoder.scorer.weight)
    del model
    gc.collect()
    assert alive() is None  # the cache does not keep the weight alive (distance: W_out is W)
    assert all(key[0] != weight_id for key in modules._entries)


def test_cached_scoring_is_one_matrix_product_over_all_positions(joined_bin):
    """The decoder's output is a transposed, non-contiguous (B, T, D) tensor; with a cached
    W_out (no grad) torch's matmul would read W_out once per sentence in a batched product."""
    model, _ = _model(joined_bin, "l2norm")
    features = torch.randn(3, 5, 16).transpose(0, 1)  # (B=5, T=3, D), non-contiguous
    with torch.no_grad(), torch.profiler.profile() as prof:
        scores = model.decoder.scorer(features)
    weight = model.decoder.scorer.weight
    assert "aten::bmm" not in {e.key for e in prof.key_averages()}
    assert scores.shape == (5, 3, weight.shape[0])
    torch.testing.assert_close(scores, output_layers.scores("l2norm", features, weight))


def test_grad_mode_eval_is_not_cached(joined_bin):
    """Eval mode with autograd on (e.g. computing gradients of a score) must not use a cache
    that would cut the gradient through the normalization."""
    model, _ = _model(joined_bin, "sqnorm")
    scorer, h = model.decoder.scorer, torch.randn(2, 16)
    with torch.no_grad():
        scorer(h)  # a cached W_out exists: it must not be used with autograd on
    scorer(h).sum().backward()
    weight = scorer.weight.detach().clone().requires_grad_()
    output_layers.scores("sqnorm", h, weight).sum().backward()
    assert scorer.weight.grad.abs().sum() > 0
    torch.testing.assert_close(scorer.weight.grad, weight.grad)


@pytest.mark.slow
def test_benchmark_runs_end_to_end_at_the_tiny_size(tmp_path):
    out = tmp_path / "bench"
    proc = run_module("fairseq_tying.bench", "--size", "tiny", "--vocab", "64", "--reps", "2",
                      "--warmup", "0", "--threads", "1", "--out", out, timeout=900)
    report = json.loads((out / "bench.json").read_text())
    res = report["results"]["64"]
    assert set(res["train"]) == {"builtin", *output_layers.names()}
    for kind in ("train", "generate"):
        assert res[kind]["builtin"]["ratio"]["median"] == 1.0
        for stats in res[kind].values():
            r = stats["ratio"]
            assert r["n"] == 2 and r["min"] <= r["median"] <= r["max"] and r["min"] > 0
            assert stats["seconds_median"] > 0
    assert res["dot_hypotheses_identical_to_builtin"] is True  # same parameters, same search
    estimate = res["train_isolated_estimate"]
    assert estimate["dot"] == 1.0 and all(estimate[r] > 1.0 for r in ("l2norm", "distance"))
    memory = res["memory"]
    assert memory["builtin"]["train"]["extra_over_builtin"] == 0
    assert all(memory[r]["train"]["bytes"] > 0 for r in output_layers.names())
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "builtin" in proc.stdout and "l2norm" in proc.stdout
    assert not list(out.glob("*.tmp*"))


def test_benchmark_rejects_fp16_on_cpu():
    proc = run_module("fairseq_tying.bench", "--fp16", check=False)
    assert proc.returncode == 2 and "--fp16 needs --device cuda" in proc.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--warmup", "-1"], "--warmup -1: give 0 (no warm-up) or more"),
    (["--train-steps", "0"], "--train-steps 0: at least 1 call is timed"),
    (["--gen-calls", "0"], "--gen-calls 0: at least 1 call is timed"),
    (["--reps", "1"], "--reps: at least 2 repetitions"),
])
def test_benchmark_counts_are_checked_by_name(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        layers.parse_args(flags)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
