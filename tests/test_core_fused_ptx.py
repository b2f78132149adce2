"""The fused loss's kernel (core/criterions/fused.py) compiled ahead of time for sm_90 (an H100
or H200) by Triton's compiler and its bundled ptxas, with no GPU: what its PTX does with the
row of scores. Every load and store of the scores is a 128-bit vector (the row stride is padded
to 16 entries); the one scalar load, the target's score, comes before the first loop, so before
any write of G over the row; neither loop holds a barrier (the lanes' maxima and sums are
reduced after the loop); ptxas spills nothing and the per-lane state leaves room for 4 programs
of 8 warps an SM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

SIGNATURE = {"scores": "*fp16", "stride": "i32", "target": "*i64", "row_loss": "*fp32",
             "row_nll": "*fp32", "row_correct": "*i32", "vocab": "i32", "ignore_index": "i32",
             "on_target": "fp32", "eps_i": "fp32", "grad_scale": "fp32", "BLOCK": "constexpr",
             "ACCURACY": "constexpr", "GRADIENT": "constexpr"}


# Run in a fresh process: Triton decides at import whether its library runs interpreted
# (TRITON_INTERPRET), and tests/test_core_fused.py needs it interpreted in its process.
COMPILE = """
import json, sys
from fairseq_tying.core.criterions import fused
if not fused.available():
    sys.exit("skip: Triton cannot be imported: " + fused.TRITON_ERROR)
from triton import compile, jit
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
aligned = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # 5 pointers, the stride
source = ASTSource(jit(fused._loss_rows), json.loads(sys.argv[1]),
                   {"BLOCK": fused.BLOCK, "ACCURACY": True, "GRADIENT": True}, aligned)
try:
    kernel = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
except (RuntimeError, FileNotFoundError) as error:  # a Triton without its CUDA tools
    sys.exit(f"skip: Triton cannot compile for sm_90 here: {error}")
from triton.backends.nvidia import compiler
print(compiler.get_ptxas(90).path)
print(kernel.asm["ptx"])
"""


@pytest.fixture(scope="module")
def compiled() -> tuple[str, str]:
    """(ptxas's path, the PTX of ``_loss_rows``) for fp16 scores, fused.BLOCK, 8 warps,
    accuracy and gradient, its pointers and the stride specialized as divisible by 16 (as
    Triton does at a launch with a padded stride: ``padded_width``); V itself unspecialized
    (32,003 is not)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(SIGNATURE)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode and proc.stderr.strip().splitlines()[-1].startswith("skip: "):
        pytest.skip(proc.stderr.strip().splitlines()[-1][6:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptxas, ptx = proc.stdout.split("\n", 1)
    return ptxas, ptx


@pytest.fixture(scope="module")
def ptx(compiled) -> str:
    return compiled[1]


def _loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of each loop: a label and the branch back to it."""
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"\s*(\$L__BB\d+_\d+):", line))}
    return [(labels[m.group(1)], i) for i, line in enumerate(lines)
            if (m := re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line))
            and labels.get(m.group(1), i) < i]


def test_scores_move_as_vectors_and_the_target_is_read_first(ptx):
    lines = ptx.splitlines()
    loops = _loops(lines)
    assert len(loops) == 2, loops  # pass 1 and pass 2
    bodies = ["\n".join(lines[first:last]) for first, last in loops]
    half = [i for i, line in enumerate(lines) if re.search(r"(ld|st)\.global\S*\.b16\b", line)]
    assert len(half) == 1 and "ld.global" in lines[half[0]], half  # s_y, nothing else scalar
    assert half[0] < loops[0][0]  # read before pass 1, so before pass 2 writes G
    assert re.search(r"ld\.global\S*\.v4\.b32", bodies[0])  # 8 fp16 scores a load
    assert re.search(r"st\.global\S*\.v4\.b32", bodies[1])  # 8 fp16 entries of G a store
    for body in bodies:
        assert "bar.sync" not in body and "bar.red" not in body


def test_ptxas_spills_nothing_and_4_programs_fit_an_sm(compiled, tmp_path):
    ptxas, ptx = compiled
    source = tmp_path / "loss_rows.ptx"
    source.write_text(ptx)
    target = re.search(r"\.target\s+(\w+)", ptx).group(1)  # sm_90a
    proc = subprocess.run([str(ptxas), f"-arch={target}", "-v", str(source), "-o",
                           str(tmp_path / "loss_rows.cubin")], capture_output=True, text=True,
                          check=True)
    info = proc.stdout + proc.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in info, info
    registers = int(re.search(r"Used (\d+) registers", info).group(1))
    assert registers * 8 * 32 * 4 <= 65536, info  # an SM's registers, 4 programs of 256 threads
