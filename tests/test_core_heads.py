"""The output layers' contract s = t(ĥ·W_outᵀ + b) and the layers beyond an affine map:
``softcap`` (c·tanh(h·w_i/c)), ``ngpt`` (s_z,i·cos(h, w_i), s_z a learned vector of V values),
a toy transform registered from one file (tests/toy_transform_layer.py), and ``--z-loss``. Each
against a formula written here independently: scores, the loss and its gradients, in fp32,
through the chunked loss (several chunks) and fairseq's own loss; the model's forward,
incremental decoding and fairseq's ``SequenceScorer``; and what registration refuses."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq import options, tasks
from fairseq.logging import metrics
from fairseq.sequence_scorer import SequenceScorer

from fairseq_tying.core import output_layers
from fairseq_tying.core.criterions.chunked import linear_loss_terms, rows_per_chunk
from fairseq_tying.core.output_layers import OutputLayer, register_output_layer
from fairseq_tying.export import ExportError, stock_arch
from tests.helpers import (
    PLUGIN_DIR,
    TINY_LM,
    TINY_MODEL,
    TOY_TRANSFORM,
    TOY_TRANSFORM_FILE,
    build_model,
    decode_full_and_incremental,
    export_args,
    learned_values,
    toy_layer_registered,
)

PAD = 1
CAP = 3.0  # a cap the scores of these tests cross: t′ far from 1


def independent_scores(output_layer: str, h: torch.Tensor, w: torch.Tensor,
                       bias: torch.Tensor | None = None, sz: torch.Tensor | None = None,
                       softcap: float = CAP) -> torch.Tensor:
    """The layers' formulas written with torch's own operations (differentiable)."""
    b = 0 if bias is None else bias
    if output_layer == "softcap":
        return softcap * torch.tanh((h @ w.T + b) / softcap)
    if output_layer == "ngpt":  # s_z = sz·(sz_init_value/sz_init_scaling) = sz·√D
        cos = F.cosine_similarity(h[:, None], w[None], dim=-1)
        return sz * math.sqrt(w.shape[1]) * cos + b
    if output_layer == TOY_TRANSFORM:
        return torch.log1p(torch.exp(h @ w.T + b))
    assert output_layer == "dot"
    return h @ w.T + b


def independent_loss(scores: torch.Tensor, target: torch.Tensor, epsilon: float,
                     z_loss: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, nll, z-loss term) summed over the non-padding targets: label-smoothed
    cross-entropy as fairseq defines it, plus λ·(log Z)²."""
    keep = target.ne(PAD)
    lprobs = scores.log_softmax(-1)
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    eps_i = epsilon / (scores.shape[1] - 1)
    loss = (1 - epsilon - eps_i) * nll - eps_i * lprobs.sum(-1)
    z = z_loss * torch.logsumexp(scores, -1) ** 2
    return ((loss + z)[keep].sum(), nll[keep].sum(), z[keep].sum())


def _inputs(vocab: int = 90, dim: int = 8, rows: int = 40, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(vocab, dim, generator=g),
            "hidden": 2 * torch.randn(rows, dim, generator=g),  # |h·w| up to ~20 > CAP
            "bias": torch.randn(vocab, generator=g),
            "sz": learned_values(vocab, dim)["sz"],
            "target": torch.where(torch.arange(rows) % 7 == 0, PAD,
                                  torch.randint(0, vocab, (rows,), generator=g))}


def _chunked(layer: OutputLayer, inputs: dict, z_loss: float, rows: int = 7):
    """(loss, nll, z term, the gradients of W, h, b₂, sz) by the chunked loss."""
    leaves = [inputs[k].clone().requires_grad_() for k in ("weight", "hidden", "bias", "sz")]
    weight, hidden, bias, sz = leaves
    settings = layer.setting_values({"softcap": CAP})
    w_out, b = layer.output_matrix_and_bias(weight, bias, sz=sz)
    transform = (functools.partial(layer.transform, **settings),
                 functools.partial(layer.derivative, **settings)) if layer.transforms else None
    vocab = weight.shape[0]
    budget = rows * vocab * 4 * (3 if transform else 1) / 2**20
    assert rows_per_chunk(vocab, torch.float32, budget / (3 if transform else 1)) == rows
    loss, nll, z, _ = linear_loss_terms(layer.scored_hidden(hidden, sz=sz), w_out, b,
                                        inputs["target"], 0.1, PAD, budget_mb=budget,
                                        transform=transform, z_loss=z_loss)
    return loss, nll, z, torch.autograd.grad(loss, leaves, allow_unused=True)


def _reference(name: str, inputs: dict, z_loss: float):
    leaves = [inputs[k].double().requires_grad_() for k in ("weight", "hidden", "bias", "sz")]
    weight, hidden, bias, sz = leaves
    scores = independent_scores(name, hidden, weight, bias, sz)
    loss, nll, z = independent_loss(scores, inputs["target"], 0.1, z_loss)
    return loss, nll, z, torch.autograd.grad(loss, leaves, allow_unused=True)


def _close(got, want, rtol=1e-5):
    assert (got is None) == (want is None)
    if got is not None:
        torch.testing.assert_close(got.double(), want, rtol=rtol,
                                   atol=rtol * want.abs().max().item())


# --- the formulas ----------------------------------------------------------------------------


@pytest.mark.parametrize("output_layer", ["softcap", "ngpt"])
def test_scores_and_their_gradients_follow_the_formula(output_layer):
    inputs = _inputs()
    leaves = [inputs[k].clone().requires_grad_() for k in ("weight", "hidden", "bias", "sz")]
    weight, hidden, bias, sz = leaves
    got = output_layers.scores(output_layer, hidden, weight, bias, sz=sz, softcap=CAP)
    want = independent_scores(output_layer,
                              *(x.detach().double() for x in (hidden, weight, bias, sz)))
    _close(got, want)
    probe = torch.randn_like(want)
    got_grads = torch.autograd.grad((got * probe).sum(), leaves, allow_unused=True)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    want = independent_scores(output_layer, ref[1], ref[0], ref[2], ref[3])
    want_grads = torch.autograd.grad((want * probe.double()).sum(), ref, allow_unused=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        _close(g, w, rtol=1e-4)
    if output_layer == "softcap":
        assert got.abs().max() <= CAP < (hidden @ weight.T + bias).abs().max()  # fp32 tanh: 1


def test_softcap_defaults_to_gemma_2s_cap():
    layer = output_layers.get("softcap")
    assert layer.setting_values() == {"softcap": 30.0}
    h, w = torch.randn(3, 4) * 40, torch.randn(6, 4)
    torch.testing.assert_close(output_layers.scores("softcap", h, w),
                               30.0 * torch.tanh(h @ w.T / 30.0))


def test_ngpt_stores_sz_as_ngpt_does_a_vector_of_v_values(joined_bin):
    """sz = sz_init_scaling·ones(V), sz_init_scaling = 1/√D, used as sz·(1/sz_init_scaling):
    every token's scale s_z starts at sz_init_value = 1 (NVIDIA/ngpt model.py)."""
    model, task = build_model(joined_bin, "transformer_twwt", "--output-layer", "ngpt")
    scorer = model.decoder.scorer
    vocab, dim = scorer.weight.shape
    assert isinstance(scorer.sz, torch.nn.Parameter) and scorer.sz.shape == (vocab,)
    assert any(p is scorer.sz for p in model.parameters())  # the optimizer trains it
    torch.testing.assert_close(scorer.sz.detach(), torch.full((vocab,), dim**-0.5))
    assert model.decoder.embed_tokens.normalize_rows  # unit input lookups, as nGPT's
    h = torch.randn(5, dim)
    torch.testing.assert_close(model.decoder.output_layer(h),
                               F.cosine_similarity(h[:, None], scorer.weight[None], dim=-1))


@pytest.mark.parametrize("z_loss", [0.0, 0.01])
@pytest.mark.parametrize("output_layer", ["softcap", "ngpt", "dot"])
def test_the_chunked_loss_and_its_gradients_follow_the_formula(output_layer, z_loss):
    inputs = _inputs()
    *got, got_grads = _chunked(output_layers.get(output_layer), inputs, z_loss)
    *want, want_grads = _reference(output_layer, inputs, z_loss)
    for g, w in zip(got, want, strict=True):
        _close(g, w)
    for g, w in zip(got_grads, want_grads, strict=True):
        _close(g, w, rtol=1e-4)
    assert (got[2] > 0) == bool(z_loss)


# --- the model: forward, incremental decoding, fairseq's SequenceScorer -----------------------


@pytest.mark.parametrize("output_layer", ["softcap", "ngpt"])
def test_the_model_decodes_incrementally_and_scores_references_by_the_formula(joined_bin,
                                                                              output_layer):
    torch.manual_seed(0)
    model, task = build_model(joined_bin, "transformer_twwt", "--output-layer", output_layer,
                              "--softcap", str(CAP), "--output-bias")
    scorer = model.decoder.scorer
    with torch.no_grad():
        scorer.bias.normal_()
        scorer.weight.mul_(8)  # affine scores beyond the cap
        if scorer.sz is not None:
            scorer.sz.copy_(learned_values(*scorer.weight.shape)["sz"])
    model.eval()
    enc, prev, full, steps = decode_full_and_incremental(model, task)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
        want = independent_scores(output_layer, features.reshape(-1, 16), scorer.weight,
                                  scorer.bias, scorer.sz).view_as(full)
    torch.testing.assert_close(full, want, rtol=1e-4, atol=1e-5)
    if output_layer == "softcap":
        assert full.abs().max() <= CAP < (features @ scorer.weight.T).abs().max()
    # --score-reference: fairseq's SequenceScorer reads the model's normalized scores
    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(d), (2, 6))
    target = torch.cat([prev[:, 1:], torch.full((2, 1), d.eos())], 1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([6, 6]),
                            "prev_output_tokens": prev}, "target": target, "id": torch.arange(2)}
    hypos = SequenceScorer(d).generate([model], sample)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.tensor([6, 6]))
        features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
        want = independent_scores(output_layer, features.reshape(-1, 16), scorer.weight,
                                  scorer.bias, scorer.sz).log_softmax(-1).view(*target.shape, -1)
    want = want.gather(-1, target[..., None]).squeeze(-1)
    for i, hypo in enumerate(hypos):
        torch.testing.assert_close(hypo[0]["positional_scores"], want[i], rtol=1e-4, atol=1e-5)


# --- --z-loss through the criterions, with and without the chunked loss -----------------------


def _first_step(argv: list[str]):
    """(model, criterion, the first 6 training samples, loss, sample size, logging output) of
    one criterion step of the model fairseq-train would build from argv, seeded."""
    import fairseq_tying  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    task.load_dataset("train")
    torch.manual_seed(0)
    model, criterion = task.build_model(args), task.build_criterion(args)
    dataset = task.dataset("train")
    sample = dataset.collater([dataset[i] for i in range(6)])
    loss, sample_size, log = criterion(model, sample)
    return model, criterion, sample, loss, sample_size, log


def _criterion_step(data, *flags: str, chunked: bool):
    model, _, sample, loss, _, log = _first_step([
        str(data), "--user-dir", PLUGIN_DIR, "--arch", "transformer_twwt", *TINY_MODEL,
        "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1",
        "--chunked-loss" if chunked else "--no-chunked-loss", "--chunked-loss-mb", "0.002",
        *flags])
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return model, sample, loss.detach(), log, grads


@pytest.mark.parametrize("output_layer", ["dot", "softcap", "ngpt", "fixnorm"])
def test_z_loss_is_the_same_with_and_without_the_chunked_loss(joined_bin, output_layer):
    flags = ("--output-layer", output_layer, "--softcap", str(CAP), "--z-loss", "0.01")
    model, sample, want, want_log, want_grads = _criterion_step(joined_bin, *flags, chunked=False)
    _, _, got, got_log, got_grads = _criterion_step(joined_bin, *flags, chunked=True)
    _, _, without, without_log, _ = _criterion_step(
        joined_bin, *flags[:-2], "--z-loss", "0", chunked=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for key in ("loss", "nll_loss", "z_loss"):
        torch.testing.assert_close(torch.as_tensor(got_log[key]).double(),
                                   torch.as_tensor(want_log[key]).double(), rtol=1e-5, atol=0)
    assert got_grads.keys() == want_grads.keys()
    scale = max(g.abs().max().item() for g in want_grads.values())  # some are ~0: rounding
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5 * scale)
    # the term: λ·Σ (log Z)² over the target tokens, of the model's own scores
    with torch.no_grad():
        scores = model(**sample["net_input"])[0].double()
    keep = sample["target"].ne(PAD)
    z_term = 0.01 * (torch.logsumexp(scores, -1)[keep] ** 2).sum()
    torch.testing.assert_close(torch.as_tensor(got_log["z_loss"]).double(), z_term, rtol=1e-5,
                               atol=0)
    torch.testing.assert_close(got - without, z_term.float(), rtol=1e-4, atol=0)
    assert "z_loss" not in without_log


def _lm_step(data, *flags: str, chunked: bool):
    """(model, sample, loss, sample size, logging output, the metrics logged from it) of one
    step of a tiny language model under cross_entropy_tying."""
    model, criterion, sample, loss, sample_size, log = _first_step([
        str(data), "--user-dir", PLUGIN_DIR, "--task", "language_modeling", "--sample-break-mode",
        "eos", "--arch", "transformer_lm_tied", *TINY_LM, "--dropout", "0",
        "--criterion", "cross_entropy_tying", "--chunked-loss" if chunked else "--no-chunked-loss",
        "--chunked-loss-mb", "0.002", *flags])
    with metrics.aggregate(new_root=True) as logged:
        type(criterion).reduce_metrics([log])
        meters = {k: float(logged.get_smoothed_value(k) if k == "ppl" else logged[k].avg)
                  for k in logged}  # unrounded, but ppl: fairseq's, to 2 decimals
    return model, sample, loss.detach(), sample_size, log, meters


@pytest.mark.parametrize("sentence_avg", [False, True], ids=["per-token", "sentence-avg"])
def test_cross_entropy_tying_logs_the_nll_apart_from_the_z_loss(lm_bin, sentence_avg):
    """fairseq's cross_entropy derives nll_loss and ppl from its loss: with --z-loss they are
    the cross-entropy alone (base 2, per token), z_loss is λ·(log Z)² per sample_size (base
    2), and the loss optimized is their sum, with and without the chunked loss."""
    flags = ("--z-loss", "0.01", *(["--sentence-avg"] if sentence_avg else []))
    model, sample, want, size, _, want_log = _lm_step(lm_bin, *flags, chunked=False)
    _, _, got, _, _, got_log = _lm_step(lm_bin, *flags, chunked=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    assert got_log.keys() == want_log.keys() == {"loss", "nll_loss", "ppl", "z_loss"}
    for key in ("loss", "nll_loss", "z_loss"):
        assert got_log[key] == pytest.approx(want_log[key], rel=1e-5), key
    with torch.no_grad():
        scores = model(**sample["net_input"])[0].double()
    keep = sample["target"].ne(PAD)
    nll = -scores.log_softmax(-1).gather(-1, sample["target"][..., None]).squeeze(-1)[keep]
    z_term = 0.01 * torch.logsumexp(scores, -1)[keep] ** 2
    assert size == (sample["target"].size(0) if sentence_avg else keep.sum().item())
    torch.testing.assert_close(want.double(), nll.sum() + z_term.sum(), rtol=1e-5, atol=0)
    for log in (want_log, got_log):
        assert log["nll_loss"] == pytest.approx(nll.mean().item() / math.log(2), rel=1e-5)
        assert log["z_loss"] == pytest.approx(z_term.sum().item() / size / math.log(2), rel=1e-5)
        assert log["loss"] == pytest.approx((nll.sum() + z_term.sum()).item() / size
                                            / math.log(2), rel=1e-5)
        assert log["ppl"] == round(2 ** log["nll_loss"], 2)
    if not sentence_avg:  # loss and nll_loss per token: the loss is the nll plus the term
        assert want_log["loss"] == pytest.approx(want_log["nll_loss"] + want_log["z_loss"])
    # without the z-loss, fairseq's own logs: no nll_loss beside a per-token loss
    for chunked in (False, True):
        log, meters = _lm_step(lm_bin, "--z-loss", "0", chunked=chunked)[-2:]
        assert "nll_loss" not in log and "z_loss" not in log
        assert meters["ppl"] == round(2 ** meters["loss"], 2)


def test_a_negative_z_loss_is_refused(joined_bin):
    with pytest.raises(ValueError, match=r"--z-loss -1.0: give a weight λ ≥ 0 \(PaLM's is 1e-4\)"):
        _criterion_step(joined_bin, "--z-loss", "-1", chunked=True)


# --- registration: the contract or a refusal naming the member --------------------------------


def _register(name: str, body: dict):
    return register_output_layer(name)(type(f"Layer_{name}", (OutputLayer,), body))


def _affine(self, weight, **_):
    return weight, None


def _refused(member: str, kind: str, body: dict, bases: tuple = (OutputLayer,)) -> None:
    """Registering ``body`` is refused naming the layer, ``member`` and its ``kind``; nothing
    is registered."""
    with pytest.raises(ValueError, match=rf"output layer 'bad' \(Layer_bad\) overrides {member} "
                                         rf"\({kind}\), a member of OutputLayer that no layer may "
                                         "change: the model, the losses and the exports compute"):
        register_output_layer("bad")(type("Layer_bad", bases, {"affine": _affine, **body}))
    assert "bad" not in output_layers.OUTPUT_LAYERS


@pytest.mark.parametrize("method", ["scores", "output_matrix_and_bias", "setting_values"])
def test_a_layer_overriding_what_no_consumer_calls_is_refused_naming_it(method):
    _refused(method, "function", {method: lambda self, *a, **k: None})


def _doubled(self, scores, **_):
    return 2 * scores


def _two(self, scores, **_):
    return torch.full_like(scores, 2.0)


@pytest.mark.parametrize("transforms", [property(lambda self: False), False],
                         ids=["property", "value"])
def test_a_layer_hiding_its_transform_from_the_consumers_is_refused(transforms):
    """transforms False beside a real t: the model, the chunked loss and the exports would
    skip t (they ask ``transforms``) while ``OutputLayer.scores`` applies it."""
    body = {"affine": _affine, "transform": _doubled, "derivative": _two}
    assert type("Honest", (OutputLayer,), body)().transforms  # without the override
    hiding = type("Hiding", (OutputLayer,), {**body, "transforms": transforms})()
    h, w = torch.randn(3, 4), torch.randn(5, 4)
    assert not hiding.transforms and torch.equal(hiding.scores(h, w), 2 * (h @ w.T))
    _refused("transforms", type(transforms).__name__, {**body, "transforms": transforms})


@pytest.mark.parametrize("kind, value", [
    ("function", lambda self, given: {}),
    ("staticmethod", staticmethod(lambda given: {})),
    ("classmethod", classmethod(lambda cls, given: {})),
])
def test_a_layer_overriding_a_private_member_is_refused_naming_it(kind, value):
    _refused("_learned", kind, {"_learned": value})


def _hiding_init(self):
    self.transforms = False  # an instance attribute the class-level checks would not see


@pytest.mark.parametrize("hook", ["__init__", "__getattr__", "__setattr__"])
def test_a_layer_with_instance_state_is_refused_naming_the_hook(hook):
    _refused(hook, "function", {hook: _hiding_init if hook == "__init__"
                                else lambda self, *a: None})


def test_a_member_overridden_by_a_mixin_before_output_layer_is_refused_naming_it():
    mixin = type("Mixin", (), {"setting_values": lambda self, given=None: {}})
    _refused("setting_values", "function of Mixin", {}, bases=(mixin, OutputLayer))


def test_a_declared_constant_given_as_a_property_is_refused():
    with pytest.raises(ValueError, match=r"'bad' \(Layer_bad\) sets unit_inputs to a property: "
                                         "it declares a constant of the layer"):
        _register("bad", {"affine": _affine, "unit_inputs": property(lambda self: True)})
    assert "bad" not in output_layers.OUTPUT_LAYERS


# --- a non-affine layer registered from one file ----------------------------------------------


def test_a_transform_layer_from_one_file_scores_trains_and_is_refused_by_the_exports():
    with toy_layer_registered(TOY_TRANSFORM_FILE, TOY_TRANSFORM) as layer:
        assert layer.transforms and TOY_TRANSFORM in output_layers.names()
        inputs = _inputs(seed=3)
        for z_loss in (0.0, 0.01):
            *got, got_grads = _chunked(layer, inputs, z_loss)
            *want, want_grads = _reference(TOY_TRANSFORM, inputs, z_loss)
            for g, w in zip([*got, *got_grads], [*want, *want_grads], strict=True):
                _close(g, w, rtol=1e-4)
        for target, ct2 in (("fairseq's transformer", False), ("CTranslate2's", True)):
            with pytest.raises(ExportError, match=(
                    rf"--output-layer {TOY_TRANSFORM} passes its scores through an element-wise "
                    rf"transform \(SoftplusDot.transform\), which {target} decoder cannot "
                    r"compute \(its output projection is linear\); keep")):
                stock_arch(export_args(output_layer=TOY_TRANSFORM), formats=("transformer",),
                           allow_bias=ct2)
    assert TOY_TRANSFORM not in output_layers.OUTPUT_LAYERS


def test_the_exports_refuse_ngpt_and_stock_fairseq_refuses_softcap_by_name():
    with pytest.raises(ExportError, match=r"--output-layer ngpt scores s_z,i·cos\(h, w_i\): it "
                                          "normalizes the decoder output h"):
        stock_arch(export_args(output_layer="ngpt"), formats=("transformer",), allow_bias=True)
    with pytest.raises(ExportError, match=(
            r"--output-layer softcap passes its scores through an element-wise transform "
            r"\(SoftCap.transform\), which fairseq's transformer decoder cannot compute \(its "
            r"output projection is linear\), or export with --format ctranslate2")):
        stock_arch(export_args(output_layer="softcap"))
    assert stock_arch(export_args(output_layer="softcap"), formats=("transformer",),
                      allow_bias=True) == "transformer"
