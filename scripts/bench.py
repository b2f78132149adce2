#!/usr/bin/env python
"""Thin wrapper: ``python scripts/bench.py ...`` = ``python -m fairseq_tying.bench ...``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_tying.bench import main  # noqa: E402

if __name__ == "__main__":
    main()
