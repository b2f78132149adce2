"""The loss benchmark (``bench --mode loss``): end to end at a tiny size (not a timing test),
its report blocks, and its refusals."""

from __future__ import annotations

import json

import pytest

from fairseq_tying.bench import loss, loss_budget, loss_peers, loss_report
from fairseq_tying.common.blocks import block_text
from tests.helpers import run_module


def _block(path, name: str) -> str:
    return block_text(path.read_text(), name).strip()


@pytest.mark.slow
def test_benchmark_runs_end_to_end_at_the_tiny_size(tmp_path):
    out, perf, readme = tmp_path / "loss.json", tmp_path / "perf.md", tmp_path / "README.md"
    perf.write_text("# Performance\n\nText before.\n")
    run_module("fairseq_tying.bench", "--mode", "loss", "--vocab", "64", "--tokens", "128",
               "--budget-vocab", "64", "--chunked-loss-mb", "0.01", "--out", out,
               "--report", perf, "--readme", readme, timeout=1200)
    report = json.loads(out.read_text())
    assert list(report["setups"]) == ["cpu:fp32"]  # no CUDA here
    entry = report["setups"]["cpu:fp32"]
    assert list(entry["results"]) == ["128"]
    for by_vocab in entry["results"].values():
        res = by_vocab["64"]
        assert set(res) == set(loss.MODELS)
        for model in loss.MODELS:  # the same weights and batch: the same loss
            assert res[model]["loss"] == pytest.approx(res["builtin"]["loss"], rel=1e-4)
            assert res[model]["cpu_s"] > 0 and res[model]["peak"] > 0
    assert {"builtin", "chunked"} <= set(entry["max_tokens"])
    assert [t for t, _ in entry["max_tokens"]["chunked"]["points"]] == [1024, 2048, 128]
    text = loss_report.tables([(out, report)], tmp_path)
    assert out.with_suffix(".md").read_text() == text
    assert perf.read_text().startswith("# Performance\n\nText before.\n")
    assert _block(perf, loss_report.TABLE_BLOCK) == text.strip()
    assert "| 128 | 64 |" in text and "[JSON](loss.json)" in text
    assert _block(readme, loss_report.SUMMARY_BLOCK) == loss_report.summary([report]).strip()
    # the blocks again from the committed report alone, nothing measured
    perf.write_text("# Performance\n")
    run_module("fairseq_tying.bench", "--mode", "loss", "--report-only", out, "--report", perf)
    assert _block(perf, loss_report.TABLE_BLOCK) == text.strip()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_the_peers_compute_the_same_loss(tmp_path):
    """--only-peers at a tiny size: F.linear + cross_entropy, Apple's Cut Cross-Entropy
    (torch_compile) and the chunked loss, each in its own process, give one loss (ε = 0, the
    same inputs), with times and memory; the table goes into the loss_peers block alone."""
    pytest.importorskip("cut_cross_entropy", reason="the dev extra installs cut-cross-entropy")
    out, perf = tmp_path / "peers.json", tmp_path / "perf.md"
    perf.write_text("# Performance\n\n<!-- loss_bench:begin -->\nkept\n<!-- loss_bench:end -->\n")
    run_module("fairseq_tying.bench", "--mode", "loss", "--only-peers", "--vocab", "64",
               "--tokens", "128", "--steps", "2", "--out", out, "--report", perf, timeout=1200)
    report = json.loads(out.read_text())
    assert report["setups"] == {} and report["peers"]["epsilon"] == 0.0
    res = report["peers"]["results"]["128"]["64"]
    assert list(res) == list(loss_report.PEERS)
    for name, r in res.items():
        assert r["loss"] == pytest.approx(res["cross_entropy"]["loss"], rel=1e-5), name
        assert r["cpu_s"] > 0 and r["peak"] > 0 and r["loss_extra"] >= 0
    hidden, weight, target = loss_peers.peer_inputs(64, 128)  # the same loss recomputed here
    want = loss.F.cross_entropy(hidden @ weight.T, target, ignore_index=1, reduction="sum")
    assert res["chunked"]["loss"] == pytest.approx(want.item(), rel=1e-5)
    assert _block(perf, loss_report.TABLE_BLOCK) == "kept"
    table = _block(perf, loss_report.PEER_BLOCK)
    assert table == loss_report.peer_tables([(out, report)], tmp_path).strip()
    assert "| 128 | 64 | " in table and "[JSON](peers.json)" in table


def test_a_peer_that_failed_is_named_under_the_table():
    ok = {"cpu_s": 2.0, "loss_extra": 200 * 2**20, "loss": 1.0}
    report = {"machine": {"cpu": "X", "cpu_count": 2, "torch": "2.13"}, "config": {},
              "peers": {"dim": 512, "steps": 3, "results": {"4096": {"64000": {
                  "cross_entropy": ok, "cce": {"error": "InductorError: no C++ compiler"},
                  "chunked": {**ok, "cpu_s": 1.0}}}}}}
    table = loss_report.peer_table(report, "p.json")
    assert "| 4,096 | 64k | 2.00 / — / 1.00 | 200 / — / 200 | — | — |" in table
    assert table.rstrip().endswith("Not measured: CCE (torch_compile) at 4,096 tokens, "
                                   "V = 64k: InductorError: no C++ compiler.")


@pytest.mark.parametrize(("flags", "message"), [
    (["--tokens", "100"], "multiple of the sentence length"),
    (["--budget-vocab", "1000"], "--budget-vocab 1000 is not in --vocab"),
    (["--chunked-loss-mb", "0"], "--chunked-loss-mb 0.0: give a positive"),
    (["--report-only", "no/such.json"], "no such report: no/such.json"),
])
def test_bad_settings_are_refused_by_name(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        loss.parse_args(flags)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_cuda_setups_need_a_cuda_device(capsys):
    if loss.torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(SystemExit):
        loss.parse_args(["--setups", "cpu:fp32", "cuda:bf16"])
    assert "no CUDA device is visible" in capsys.readouterr().err
    assert loss.parse_args([]).setups == ["cpu:fp32"]


def test_the_budget_fit_recovers_a_known_line():
    """Peaks exactly on 300 MB + 70 kB a token: the fit gives that line, no residual, and the
    largest batch within 4 GiB is (4 GiB − 300 MB) / 70 kB for both losses; the chunked loss at
    a tenth of the slope fits ten times the tokens beyond its fixed part."""
    a, slope = 300e6, {"builtin": 70e3, "chunked": 7e3}

    def peak(model: str, tokens: int) -> dict:
        return {"peak": int(a + slope[model] * tokens)}

    measured = {"4096": {"64": {m: peak(m, 4096) for m in slope}},
                "8192": {"64": {"builtin": {"skipped": "predicted peak"},
                                "chunked": peak("chunked", 8192)}}}
    out = loss_budget.max_tokens(measured, lambda m, v, t: peak(m, t), 4.0, 64, [4096, 8192])
    for model, b in slope.items():
        line = out[model]
        assert line["fixed_bytes"] == pytest.approx(a, abs=1.0)
        assert line["bytes_per_token"] == pytest.approx(b, rel=1e-9)
        assert line["max_residual_bytes"] < 1.0
        assert line["max_tokens"] == int((4 * 2**30 - a) / b)
    assert [t for t, _ in out["builtin"]["points"]] == [1024, 2048, 4096]  # a skip is no point
    assert [t for t, _ in out["chunked"]["points"]] == [1024, 2048, 4096, 8192]
    assert out["ratio"] == pytest.approx(10.0, rel=1e-3)


def test_a_peak_is_extrapolated_linearly_in_the_vocabulary():
    by_vocab = {"8000": {"builtin": {"peak": 100}}, "32000": {"builtin": {"peak": 400}},
                "64000": {"builtin": {"skipped": "out of memory"}}}
    assert loss_budget.predicted_peak(by_vocab, "builtin", 128000) == 1600  # from V = 32k
    assert loss_budget.predicted_peak(by_vocab, "chunked", 128000) is None
    assert loss_budget.available_memory() > 0  # /proc/meminfo on Linux


def test_a_cut_off_report_names_what_it_lacks_and_each_skip_once():
    """A report without some of its run's configurations names them (and the missing
    largest-batch fit) under its table; a model skipped everywhere for one reason is named
    once. Memory is in MiB (2**20 bytes)."""
    skip = {"skipped": "torch 2.11.0+cu130 has no F.linear_cross_entropy"}
    res = {"builtin": {"loss_extra": 4e8, "wall_s": 0.01, "loss": 1.0},
           "chunked": {"loss_extra": 1e8, "wall_s": 0.02, "loss": 1.0}, "chunked_old": skip}
    entry = {"device": "cuda", "dtype": "fp16", "steps": 3,
             "results": {"4096": {"8000": res, "64000": res}}}
    report = {"config": {"tokens": [4096, 16384], "vocab": [8000, 64000]}}
    text = loss_report.setup_table(entry, report)
    assert "Not measured: torch's op (every batch and V): torch 2.11.0+cu130 has no " \
           "F.linear_cross_entropy." in text
    assert ("Not in this report: 16,384 tokens, V = 8k; "
            "16,384 tokens, V = 64k; the largest-batch fit.") in text
    assert "| 4,096 | 8k | 381 / — / 95 |" in text  # 4e8 and 1e8 bytes in MiB
    assert "loss extra MiB: built-in / torch's op / chunked" in text
    assert "Not in this report" not in loss_report.setup_table(
        entry, {"config": {"tokens": 4096, "vocab": [8000, 64000], "no_max_tokens": True}})
