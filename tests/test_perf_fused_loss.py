"""scripts/gpu_fused_loss.py (make gpu-fused) at its tiny size on the CPU, the kernel in
Triton's interpreter, without fairseq: the report it writes (the preflight and the products it
chose, every output layer checked in fp16 and bf16, the phases of a fused step, the timings with
their quartiles, the budgets), the docs' tables built from it, and the Makefile's target; and,
Triton made unimportable, a failed preflight that leaves the baselines measured."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from fairseq_tying.core.output_layers import BASELINE, OUTPUT_LAYERS
from tests.helpers import REPO, load_script

SCRIPT = REPO / "scripts" / "gpu_fused_loss.py"


def _tiny_run(folder, blocked: tuple[str, ...]):
    """(process, report path) of one ``--tiny`` run with the ``blocked`` modules unimportable."""
    for name in blocked:
        (folder / "blocked" / name).mkdir(parents=True)
        (folder / "blocked" / name / "__init__.py").write_text(
            f"raise ImportError('{name} blocked')\n")
    out = folder / "report.json"
    env = {**os.environ, "PYTHONPATH": str(folder / "blocked"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    return proc, out


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """(report path, report) of one ``--tiny`` run, with fairseq made unimportable."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton cannot be imported: the script's fused path runs only through it "
                    "(pip install 'triton>=3.6,<3.7', the dev extra)")
    proc, out = _tiny_run(tmp_path_factory.mktemp("gpu_fused"), ("fairseq",))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"wrote {out}" in proc.stdout
    return out, json.loads(out.read_text())


@pytest.mark.slow
def test_the_tiny_run_checks_every_layer_and_times_every_method(tiny_report):
    _, report = tiny_report
    script = load_script("gpu_fused_loss")
    assert report["status"] == "done" and report["all_correct"] and "errors" not in report
    machine = report["machine"]
    assert machine["torch"] == torch.__version__ and machine["triton"].startswith("3.6")
    assert machine["device"] == "cpu" and machine["gpu"] is None and machine["date"][:2] == "20"
    assert report["host_syncs"] == "not checked (CPU)"
    # this CPU's torch has no half product with fp32 sums: the probe chose fp32 copies
    pre = report["preflight"]
    assert pre["passed"] and pre["kernel_loss_error"] < 1e-3
    assert pre["products"] == {"fp16": "fp32 operands", "bf16": "fp32 operands"}
    assert set(report["products"]) == {"cpu float16", "cpu bfloat16"}
    assert all(p["path"] == "fp32 operands" and len(p["refused"]) == 2
               for p in report["products"].values())
    b, sizes = report["breakdown"], report["sizes"]
    assert (b["vocab"], b["tokens"]) == (max(sizes["vocab"]), max(sizes["tokens"]))
    assert list(b["median_ms"]) == list(script.PHASES) and b["product"] == "fp32 operands"
    assert b["median_ms"]["kernel"] > 0 and b["reps"] == 3
    assert b["total_ms"] == pytest.approx(sum(b["median_ms"].values()))
    assert report["goals"] == {"time_ratio_max": 0.9, "memory_ratio_max": 0.25,
                               "from_vocab": 32000}
    assert set(report["correctness"]) == {"fp16", "bf16"}
    for dtype, by_layer in report["correctness"].items():
        assert list(by_layer) == list(OUTPUT_LAYERS)
        loss_bound, grad_bound = script.BOUNDS[dtype]
        for layer, result in by_layer.items():
            fused = result["fused"]
            assert result["passed"] and fused["loss_error"] < loss_bound, (dtype, layer)
            assert set(fused["grad_errors"]) >= {"weight", "hidden", "output_bias"}
            assert ("gain" in fused["grad_errors"]) == (layer == "fixnorm")
            assert max(fused["grad_errors"].values()) < grad_bound
            assert {"builtin", "chunked"} <= set(result)  # the references' errors beside
    sizes = report["sizes"]
    want = {f"dot/{v}/{t}" for v in sizes["vocab"] for t in sizes["tokens"]}
    want |= {f"{layer}/{sizes['layer_vocab']}/{sizes['layer_tokens']}"
             for layer in (la for la in OUTPUT_LAYERS if la != BASELINE)}
    assert set(report["timing"]) == want
    for key, entry in report["timing"].items():
        # the fused path timed before the eager one, after the built-in
        assert [k for k in entry if k in script.METHODS] == ["builtin", "fused", "chunked"]
        for method in ("builtin", "chunked", "fused"):
            t = entry[method]
            assert t["reps"] == 3 and 0 < t["q1_ms"] <= t["median_ms"] <= t["q3_ms"], key
            assert t["peak_mb"] is None  # CUDA only
        assert entry["time_ratio"] == entry["fused"]["median_ms"] / entry["builtin"]["median_ms"]
        if key.startswith("dot/"):
            assert set(entry["fused_budgets"]) == {f"{mb:g}" for mb in sizes["budgets"]}
            # the tiny batches fit one chunk at every budget: measured once, then taken
            first, *rest = entry["fused_budgets"].values()
            assert first["rows"] == entry["tokens"] and "same_rows_as" not in first
            assert all(r["same_rows_as"] == f"{sizes['budgets'][0]:g}" for r in rest)
            assert entry["best_budget_mb"] in entry["fused_budgets"]
    assert report["best_budget_mb"] in {f"{mb:g}" for mb in sizes["budgets"]}
    assert report["goals_met"] is None  # no memory measured on the CPU


@pytest.mark.slow
def test_the_docs_tables_come_from_the_report(tiny_report, tmp_path):
    path, report = tiny_report
    script = load_script("gpu_fused_loss")
    text = script.markdown(report)
    for layer in OUTPUT_LAYERS:
        assert f"| {layer} | " in text
    assert "| dot | 16 | 1k | " in text and "| fixnorm | 8 | 300 | " in text
    assert "ms, median (quartiles): built-in / fused / chunked |" in text
    assert "Preflight passed" in text and "fp16 fp32 operands" in text
    assert "The fused step's phases at V = 1,000, 16 tokens" in text
    assert f"Triton {report['machine']['triton']}" in text and "status: done" in text
    docs = tmp_path / "performance.md"
    docs.write_text("before\n<!-- fused_loss:begin -->\nold\n<!-- fused_loss:end -->\nafter\n")
    assert script.main(["--report-only", str(path), "--docs", str(docs)]) == 0
    written = docs.read_text()
    assert written.startswith("before\n<!-- fused_loss:begin -->\n**cpu (Triton's interp")
    assert written.endswith("|\n<!-- fused_loss:end -->\nafter\n") and "old" not in written
    assert f"[JSON]({os.path.relpath(path, tmp_path)})" in written


def test_the_docs_hold_the_block_and_make_runs_the_script():
    assert "<!-- fused_loss:begin -->" in (REPO / "docs" / "performance.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    line = "$(FUSED_PYTHON) scripts/gpu_fused_loss.py --out work/gpu_fused/gpu_fused_loss.json"
    assert f"gpu-fused:\n\t{line}" in makefile


@pytest.mark.slow
def test_a_failed_preflight_still_measures_the_baselines(tmp_path):
    """Triton unimportable (as where its launcher cannot be built): the preflight's error is
    recorded, the fused path is neither checked nor timed, the built-in and the eager path are,
    and the run exits 1."""
    proc, out = _tiny_run(tmp_path, ("fairseq", "triton"))
    assert proc.returncode == 1 and "the preflight failed" in proc.stderr
    report = json.loads(out.read_text())
    assert report["status"] == "done" and not report["all_correct"]
    assert report["preflight"] == {"passed": False, "error": "Triton cannot be imported "
                                   "(ImportError: triton blocked)"}
    assert report["errors"] == [f"preflight: {report['preflight']['error']}"]
    assert "breakdown" not in report and "host_syncs" not in report
    for by_layer in report["correctness"].values():
        for result in by_layer.values():
            assert not result["passed"] and "fused" not in result
            assert result["chunked"]["loss_error"] < 1e-4
    for entry in report["timing"].values():
        assert "fused" not in entry and "fused_budgets" not in entry
        assert entry["builtin"]["median_ms"] > 0 and entry["chunked"]["median_ms"] > 0
