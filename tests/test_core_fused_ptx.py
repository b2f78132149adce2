"""The fused loss's kernel (core/criterions/fused.py) compiled ahead of time for sm_90 (an H100
or H200) by Triton's compiler and its bundled ptxas, with no GPU: what its PTX does with the
row of scores. Every load and store of the scores is a 128-bit vector (the row stride is padded
to 16 entries); the one scalar load, the target's score, comes before the first loop, so before
any write of G over the row; neither loop holds a barrier (the lanes' maxima and sums are
reduced after the loop); ptxas spills nothing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fairseq_tying.core.criterions import fused

SIGNATURE = {"scores": "*fp16", "stride": "i32", "target": "*i64", "row_loss": "*fp32",
             "row_nll": "*fp32", "row_correct": "*i32", "vocab": "i32", "ignore_index": "i32",
             "on_target": "fp32", "eps_i": "fp32", "grad_scale": "fp32", "BLOCK": "constexpr",
             "ACCURACY": "constexpr", "GRADIENT": "constexpr"}


@pytest.fixture(scope="module")
def ptx() -> str:
    """The PTX of ``_loss_rows`` for fp16 scores, BLOCK 4096, 8 warps, accuracy and gradient,
    its pointers and the stride specialized as divisible by 16 (as Triton does at a launch with
    a padded stride: ``padded_width``); V itself unspecialized (32,003 is not)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        if not fused.available():
            pytest.skip(f"Triton cannot be imported ({fused.TRITON_ERROR})")
        from triton import compile, jit
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        aligned = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # 5 pointers, stride
        source = ASTSource(jit(fused._loss_rows), SIGNATURE,
                           {"BLOCK": 4096, "ACCURACY": True, "GRADIENT": True}, aligned)
        try:
            kernel = compile(source, target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": 8})
        except (RuntimeError, FileNotFoundError) as error:  # a Triton without its CUDA tools
            pytest.skip(f"Triton cannot compile for sm_90 here: {error}")
    return kernel.asm["ptx"]


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


def test_ptxas_spills_nothing(ptx, tmp_path):
    from triton.backends.nvidia import compiler

    ptxas = Path(compiler.get_ptxas(90).path)
    source = tmp_path / "loss_rows.ptx"
    source.write_text(ptx)
    target = re.search(r"\.target\s+(\w+)", ptx).group(1)  # sm_90a
    proc = subprocess.run([str(ptxas), f"-arch={target}", "-v", str(source), "-o",
                           str(tmp_path / "loss_rows.cubin")], capture_output=True, text=True,
                          check=True)
    info = proc.stdout + proc.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in info, info
