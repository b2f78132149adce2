"""What the docs list of the code is what the code has: the values a sweep's grid takes."""

from __future__ import annotations

import re

from fairseq_tying.core.models.tying import TYING_MODES
from fairseq_tying.core.output_layers import OUTPUT_LAYERS
from tests.helpers import REPO


def _listed(text: str, key: str) -> tuple[str, ...]:
    """The values a doc lists for ``key`` as ``key`` (`a`/`b`/...)."""
    found = re.search(rf"`{key}` \(((?:`\w+`/?)+)\)", text)
    assert found, f"no list of {key} values"
    return tuple(re.findall(r"`(\w+)`", found.group(1)))


def test_slurm_md_lists_every_output_layer_and_tying_a_grid_takes():
    text = (REPO / "docs" / "slurm.md").read_text()
    assert _listed(text, "output_layer") == tuple(OUTPUT_LAYERS)
    assert _listed(text, "tying") == tuple(TYING_MODES)
