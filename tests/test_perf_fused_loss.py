"""scripts/gpu_fused_loss.py (make gpu-fused) at its tiny size on the CPU, the kernel in
Triton's interpreter, without fairseq: the report it writes (every output layer checked in fp16
and bf16, the timings with their quartiles, the budgets), the docs' tables built from it, and
the Makefile's target."""

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


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """(report path, report) of one ``--tiny`` run, with fairseq made unimportable."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton cannot be imported: the script's fused path runs only through it "
                    "(pip install 'triton>=3.6,<3.7', the dev extra)")
    folder = tmp_path_factory.mktemp("gpu_fused")
    blocked = folder / "blocked" / "fairseq"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('the GPU script imports fairseq')\n")
    out = folder / "report.json"
    env = {**os.environ, "PYTHONPATH": str(blocked.parent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
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
        for method in ("builtin", "chunked", "fused"):
            t = entry[method]
            assert t["reps"] == 3 and 0 < t["q1_ms"] <= t["median_ms"] <= t["q3_ms"], key
            assert t["peak_mb"] is None  # CUDA only
        assert entry["time_ratio"] == entry["fused"]["median_ms"] / entry["builtin"]["median_ms"]
        if key.startswith("dot/"):
            assert set(entry["fused_budgets"]) == {f"{mb:g}" for mb in sizes["budgets"]}
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
