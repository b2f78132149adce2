"""The kernel pins (``common/reproducible.py``): set for the block's child processes, and the
caller's environment given back afterwards, even when the block fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fairseq_tying.common.reproducible import PINNED, has_avx2, pinned_env, pinned_environ


def _child_sees(keys: list[str]) -> dict[str, str | None]:
    code = f"import os, json; print(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_a_child_inherits_the_pins_and_the_caller_gets_its_environment_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # set by the user: kept
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(key, raising=False)
    before = dict(os.environ)
    keys = ["OMP_NUM_THREADS", *PINNED]
    with pinned_environ():
        seen = _child_sees(keys)
    assert seen["OMP_NUM_THREADS"] == "1" and seen["MKL_CBWR"] == "COMPATIBLE"
    pinned = "avx2" if has_avx2() else None
    assert seen["ATEN_CPU_CAPABILITY"] == pinned
    assert dict(os.environ) == before
    assert pinned_env()["MKL_CBWR"] == "COMPATIBLE"


def test_the_environment_comes_back_when_the_block_fails():
    before = dict(os.environ)
    with pytest.raises(KeyError), pinned_environ():
        os.environ["FAIRSEQ_TYING_SET_INSIDE"] = "1"
        raise KeyError("inside")
    assert dict(os.environ) == before
