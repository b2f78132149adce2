"""Statistics over seeds: the typed cells, intervals and tests, comparisons, verdict rules."""
