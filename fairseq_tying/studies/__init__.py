"""Comparing runs: the study records, the across-run engine and its specs, the significance
tests and verdict rules, the views that render a study's report blocks and plots, and
``collect`` over a sweep's run folders (one run is scored by ``fairseq_tying.evaluation``)."""
