"""Pretrained vectors in the (tied) matrices, the learned output bias b₂, and the guards that
keep a resumed run what it was, through fairseq's real command-line tools."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from fairseq_tying.core import output_layers
from tests.helpers import (
    arch_name,
    build_model,
    decode_full_and_incremental,
    generate,
    last_updates,
    reference_scores,
    run_cli,
    run_module,
    train_args,
)

LR = 0.002  # train_args' Adam learning rate: one early Adam step moves a weight by about LR


def write_vectors(path: Path, tokens: list[str], dim: int, seed: int) -> dict[str, torch.Tensor]:
    """A fairseq text embedding file (header, then 'token v1 … vD'); returns what it holds."""
    g = torch.Generator().manual_seed(seed)
    rows = {t: [f"{x:.4f}" for x in (torch.randn(dim, generator=g) + 3).tolist()] for t in tokens}
    lines = [f"{len(rows)} {dim}", *(f"{t} {' '.join(v)}" for t, v in rows.items())]
    path.write_text("\n".join(lines) + "\n")
    return {t: torch.tensor([float(x) for x in v]) for t, v in rows.items()}


def _model_state(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, weights_only=True)["model"]


def _rows(matrix: torch.Tensor, dictionary, vectors: dict) -> tuple[torch.Tensor, torch.Tensor]:
    found = [t for t in vectors if t != "<pad>" and t in dictionary.indices]
    return matrix[[dictionary.index(t) for t in found]], torch.stack([vectors[t] for t in found])


def _dictionary(data: Path, lang: str):
    from fairseq.data import Dictionary

    return Dictionary.load(str(data / f"dict.{lang}.txt"))


# --- pretrained embeddings -------------------------------------------------------------------

SRC_TOKENS = ["w1", "w2", "w3", "w5", "<pad>", "not-in-the-dictionary"]
TGT_TOKENS = ["W1", "W2", "W4", "W7", "<pad>"]
PRETRAINED_CASES = [  # family, tying, output_layer, D, which files, frozen
    ("transformer", "three_way", "dot", 16, "encoder", True),
    ("transformer", "three_way", "l2norm", 8, "decoder", True),
    ("dynamicconv", "decoder", "cosine", 8, "both", False),
    ("dynamicconv", "none", "dot", 16, "both", True),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "tying", "output_layer", "dim", "files", "frozen"), PRETRAINED_CASES
)
def test_pretrained_vectors_are_in_the_trained_matrix(
    joined_bin, tmp_path, family, tying, output_layer, dim, files, frozen
):
    narrow = ["--tied-embed-dim", str(dim), "--tied-projection"] if dim != 16 else []
    if tying == "three_way" and dim != 16:
        narrow += ["--encoder-embed-dim", str(dim)]  # the encoder works at D
    enc_dim = dim if tying == "three_way" else 16
    tokens = SRC_TOKENS + TGT_TOKENS if tying == "three_way" else SRC_TOKENS
    enc = write_vectors(tmp_path / "enc.txt", tokens, enc_dim, seed=1)
    dec = write_vectors(tmp_path / "dec.txt", TGT_TOKENS, dim, seed=2)
    paths = {
        "encoder": ["--encoder-embed-path", str(tmp_path / "enc.txt")],
        "decoder": ["--decoder-embed-path", str(tmp_path / "enc.txt")],
        "both": [
            "--encoder-embed-path",
            str(tmp_path / "enc.txt"),
            "--decoder-embed-path",
            str(tmp_path / "dec.txt"),
        ],
    }[files]
    proc = run_cli(
        "fairseq-train",
        *train_args(
            joined_bin,
            tmp_path,
            arch_name(family, tying),
            "--tying",
            tying,
            "--output-layer",
            output_layer,
            *narrow,
            *paths,
            *(["--freeze-embeddings"] if frozen else []),
            "--save-interval-updates",
            "1",
            updates=3,
        ),
    )
    log = proc.stdout + proc.stderr
    first, last = (
        _model_state(tmp_path / "checkpoint_1_1.pt"),
        _model_state(tmp_path / "checkpoint_last.pt"),
    )
    d = _dictionary(joined_bin, "src")  # joined: one dictionary for both sides
    in_dict = len([t for t in tokens if t in d.indices and t != "<pad>"])
    assert f"{in_dict} of {len(d)} dictionary entries got a {enc_dim}-d vector" in log
    if files == "both":
        n_dec = len([t for t in TGT_TOKENS if t != "<pad>"])
        assert f"--decoder-embed-path {tmp_path / 'dec.txt'}: {n_dec} of {len(d)}" in log

    matrices = {
        "encoder.embed_tokens.weight": enc,
        "decoder.embed_tokens.weight": enc if tying == "three_way" else dec,
    }
    for key, vectors in matrices.items():
        if files == "encoder" and key.startswith("decoder") and tying != "three_way":
            continue
        got, want = _rows(last[key], d, vectors)
        if frozen:
            assert torch.equal(got, want), key
            assert torch.equal(first[key], last[key]), f"{key} changed while frozen"
        else:  # trained: three updates moved each entry by about 3·LR at most
            assert not torch.equal(got, want) and (got - want).abs().max() < 4 * 3 * LR, key
        assert not last[key][d.pad()].any(), "the padding row stays zero"
    if tying != "none":
        assert torch.equal(last["decoder.scorer.weight"], last["decoder.embed_tokens.weight"])
    # everything else trains: the projection, an untied output matrix, the decoder's layers
    for key in ("decoder.scorer.projection.weight", "decoder.scorer.weight"):
        if key in last and (key != "decoder.scorer.weight" or tying == "none"):
            assert not torch.equal(first[key], last[key]), key
    assert any(not torch.equal(first[k], last[k]) for k in last if k.startswith("decoder.layers"))
    if family == "transformer" and tying == "three_way" and dim == 16:
        # the stock export holds the vectors and must not make stock fairseq read the file
        out = tmp_path / "stock.pt"
        run_module("fairseq_tying.export", tmp_path / "checkpoint_last.pt", out)
        cfg = torch.load(out, weights_only=True)["cfg"]["model"]
        assert cfg["encoder_embed_path"] is None and cfg["decoder_embed_path"] is None


@pytest.mark.slow
@pytest.mark.parametrize("case", ["size", "two_files", "missing"])
def test_embedding_file_errors_name_the_flag(joined_bin, tmp_path, case):
    write_vectors(tmp_path / "v8.txt", ["w1", "W1"], 8, seed=0)
    write_vectors(tmp_path / "v16.txt", ["w1", "W1"], 16, seed=0)
    arch, flags, expected = {
        "size": (
            "transformer_dwt",
            ["--decoder-embed-path", str(tmp_path / "v8.txt")],
            ["--decoder-embed-path", "D=8", "16 columns", "--tied-embed-dim 8 --tied-projection"],
        ),
        "two_files": (
            "transformer_twwt",
            [
                "--encoder-embed-path",
                str(tmp_path / "v16.txt"),
                "--decoder-embed-path",
                str(tmp_path / "v8.txt"),
            ],
            ["three_way", "two files", "v16.txt", "v8.txt"],
        ),
        "missing": (
            "dynamicconv_twwt",
            ["--encoder-embed-path", str(tmp_path / "nope.txt")],
            ["--encoder-embed-path", "nope.txt", "no such file"],
        ),
    }[case]
    proc = run_cli("fairseq-train", *train_args(joined_bin, tmp_path, arch, *flags), check=False)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    for part in expected:
        assert part in message, message
    assert not (tmp_path / "checkpoint_last.pt").exists()


# --- the output bias b₂ ---------------------------------------------------------------------


@pytest.mark.parametrize("output_layer", output_layers.names())
@pytest.mark.parametrize("tying", ["none", "decoder", "three_way"])
def test_output_bias_adds_to_every_rule(joined_bin, tying, output_layer):
    torch.manual_seed(0)
    family = "transformer" if tying != "decoder" else "dynamicconv"
    flags = ("--tying", tying, "--output-layer", output_layer, "--tied-projection")
    plain, _ = build_model(joined_bin, arch_name(family, tying), *flags)
    model, _ = build_model(joined_bin, arch_name(family, tying), *flags, "--output-bias")
    scorer = model.decoder.scorer
    vocab = scorer.weight.shape[0]
    assert (
        sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters())
        == vocab
    )
    assert not scorer.bias.any()  # zero init: the same scores as without the bias
    with torch.no_grad():
        scorer.weight[model.decoder.embed_tokens.padding_idx].normal_()  # no zero row here
        scorer.bias.normal_()
    h = torch.randn(3, 16)
    want = reference_scores(output_layer, scorer.projection(h), scorer.weight,
                            bias=scorer.bias, **scorer.layer_parameters()).float()
    torch.testing.assert_close(model.decoder.output_layer(h), want, rtol=1e-5, atol=1e-5)
    model.eval()
    with torch.no_grad():  # the cached inference path, and the affine map an exporter reads
        torch.testing.assert_close(model.decoder.output_layer(h), want, rtol=1e-5, atol=1e-5)
        w_out, b = scorer.output_matrix_and_bias()
        torch.testing.assert_close(
            scorer.transform(torch.nn.functional.linear(scorer.project(h), w_out, b)), want,
            rtol=1e-5, atol=1e-5)
    scores = model.decoder.output_layer(h)
    scores.logsumexp(-1).sum().backward()
    assert scorer.bias.grad is not None and scorer.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_incremental_decoding_with_output_bias(joined_bin, output_layer):
    torch.manual_seed(0)
    model, task = build_model(
        joined_bin, "transformer_twwt", "--output-layer", output_layer, "--output-bias"
    )
    with torch.no_grad():
        model.decoder.scorer.bias.normal_()
    model.eval()
    enc, prev, full, steps = decode_full_and_incremental(model, task)
    with torch.no_grad():
        without, _ = model.decoder(prev, encoder_out=enc, features_only=True)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)
    scorer = model.decoder.scorer
    want = reference_scores(output_layer, without.reshape(-1, without.shape[-1]),
                            scorer.weight, bias=scorer.bias, **scorer.layer_parameters())
    torch.testing.assert_close(full, want.view_as(full).float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("output_layer", output_layers.names())
def test_output_bias_is_saved_and_loaded(joined_bin, tmp_path, output_layer):
    """A state dict written to disk and loaded by fairseq's ``load_state_dict`` (the path of
    every fairseq tool) into a freshly built model, for every rule."""
    flags = ("--output-layer", output_layer, "--output-bias")
    model, _ = build_model(joined_bin, "transformer_twwt", *flags)
    with torch.no_grad():
        model.decoder.scorer.bias.normal_()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    fresh, _ = build_model(joined_bin, "transformer_twwt", *flags)
    assert not fresh.decoder.scorer.bias.any()
    fresh.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert torch.equal(fresh.decoder.scorer.bias, model.decoder.scorer.bias)
    h = torch.randn(2, 16)
    torch.testing.assert_close(fresh.decoder.output_layer(h), model.decoder.output_layer(h))


@pytest.mark.slow
@pytest.mark.parametrize("output_layer", ["dot", "distance"])
def test_output_bias_survives_resuming(joined_bin, tmp_path, output_layer):
    """Resumed from update 2, the run ends where the uninterrupted run is at update 3
    (``dot``: the bias alone; ``distance``: added to the rule's own bias)."""
    flags = ("--output-layer", output_layer, "--output-bias", "--tied-projection")
    straight = tmp_path / "straight"
    run_cli(
        "fairseq-train",
        *train_args(
            joined_bin,
            straight,
            "transformer_twwt",
            *flags,
            "--save-interval-updates",
            "1",
            updates=3,
        ),
    )
    resumed = tmp_path / "resumed"
    proc = run_cli(
        "fairseq-train",
        *train_args(
            joined_bin,
            resumed,
            "transformer_twwt",
            *flags,
            updates=3,
        ),
        "--restore-file",
        str(straight / "checkpoint_1_2.pt"),
    )
    log = proc.stdout + proc.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_1_2\.pt \(epoch \d+ @ 2 updates\)", log)
    assert last_updates(log) == 3
    want, got = (
        _model_state(straight / "checkpoint_1_3.pt"),
        _model_state(resumed / "checkpoint_last.pt"),
    )
    bias = "decoder.scorer.bias"
    assert want[bias].abs().min() > 0  # trained away from its zero start, every token
    torch.testing.assert_close(got[bias], want[bias], rtol=0, atol=1e-6)
    torch.testing.assert_close(
        got["decoder.scorer.weight"], want["decoder.scorer.weight"], rtol=0, atol=1e-6
    )
    if output_layer == "dot":  # stock fairseq has no output bias: the export refuses it
        out = tmp_path / "stock.pt"
        proc = run_module("fairseq_tying.export", resumed / "checkpoint_last.pt", out,
                          check=False)
        assert proc.returncode == 2 and "--output-bias" in proc.stderr and not out.exists()
    if output_layer != "distance":
        return
    assert len(generate(joined_bin, resumed / "checkpoint_last.pt", "--beam", "3")) == 20


# --- guards ---------------------------------------------------------------------------------

BASE = ("--output-layer", "dot", "--tied-projection")


@pytest.fixture(scope="module")
def trained_dir(joined_bin, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("guarded")
    run_cli("fairseq-train", *train_args(joined_bin, folder, "transformer_twwt", *BASE, updates=2))
    return folder


CHANGES = {  # flag: (the resumed run's flags, value in the checkpoint, value asked for)
    "--output-layer": (
        ["--output-layer", "cosine", "--tied-projection"],
        "--output-layer dot",
        "--output-layer cosine",
    ),
    "--tying": ([*BASE, "--tying", "decoder"], "--tying three_way", "--tying decoder"),
    "--tied-embed-dim": (
        [*BASE, "--tied-embed-dim", "8", "--encoder-embed-dim", "8"],
        "--tied-embed-dim 16",
        "--tied-embed-dim 8",
    ),
    "--tied-projection": (["--output-layer", "dot"], "--tied-projection", "no --tied-projection"),
    "--output-bias": ([*BASE, "--output-bias"], "no --output-bias", "--output-bias"),
}


def _resume_args(data: Path, folder: Path, *flags: str) -> list[str]:
    return train_args(data, folder, "transformer_twwt", *flags, updates=4)


@pytest.mark.slow
@pytest.mark.parametrize("flag", CHANGES)
def test_resume_with_another_flag_is_refused(joined_bin, trained_dir, flag):
    extra, before, now = CHANGES[flag]
    ckpt = trained_dir / "checkpoint_last.pt"
    stamp = ckpt.stat().st_mtime_ns
    proc = run_cli("fairseq-train", *_resume_args(joined_bin, trained_dir, *extra), check=False)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert f"trained with {before}, but this run asks for {now}" in message, message
    assert str(ckpt) in message
    if flag != "--tied-embed-dim":
        assert "--finetune-from-model" in message and "--reset-optimizer" in message
    assert ckpt.stat().st_mtime_ns == stamp  # nothing trained, nothing written


@pytest.mark.slow
def test_starting_from_a_checkpoint_on_purpose(joined_bin, trained_dir, tmp_path):
    ckpt = trained_dir / "checkpoint_last.pt"
    # --reset-optimizer in the same --save-dir: the new output bias starts at zero
    copy = tmp_path / "reset"
    shutil.copytree(trained_dir, copy)
    proc = run_cli(
        "fairseq-train",
        *_resume_args(joined_bin, copy, *BASE, "--output-bias", "--reset-optimizer"),
    )
    assert "has no decoder.scorer.bias: it starts at zero" in proc.stdout + proc.stderr
    assert "decoder.scorer.bias" in _model_state(copy / "checkpoint_last.pt")
    # --finetune-from-model into a new --save-dir with another rule
    proc = run_cli(
        "fairseq-train",
        *_resume_args(
            joined_bin,
            tmp_path / "ft",
            "--output-layer",
            "cosine",
            "--tied-projection",
            "--finetune-from-model",
            str(ckpt),
        ),
    )
    assert last_updates(proc.stdout + proc.stderr) == 4
    cfg = torch.load(tmp_path / "ft" / "checkpoint_last.pt", weights_only=True)["cfg"]["model"]
    assert cfg.output_layer == "cosine"


@pytest.mark.slow
def test_non_finite_embedding_rows_are_named(joined_bin, trained_dir, tmp_path):
    state = torch.load(trained_dir / "checkpoint_last.pt", weights_only=True)
    d = _dictionary(joined_bin, "src")
    rows = [d.index("w3"), d.index("W5")]
    state["model"]["decoder.scorer.weight"][rows[0]] = float("nan")
    state["model"]["decoder.scorer.weight"][rows[1], 2] = float("inf")
    broken = tmp_path / "broken.pt"
    torch.save(state, broken)
    proc = run_cli(
        "fairseq-generate",
        str(joined_bin),
        "--user-dir",
        "fairseq_tying",
        "--path",
        str(broken),
        "--beam",
        "2",
        "--cpu",
        check=False,
    )
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    # three-way tying: one storage under three keys, all named
    for part in (
        "encoder.embed_tokens.weight",
        "decoder output embedding",
        "2 of",
        f"{rows[0]} ('w3')",
        f"{rows[1]} ('W5')",
    ):
        assert part in message, message
