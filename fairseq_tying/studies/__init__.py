"""Comparing runs: the study records, the across-run engine, its typed cells and its specs, the
significance tests and verdict rules, the views that render a study's report blocks and plots, and
``collect`` over a sweep's run folders (one run is scored by ``fairseq_tying.evaluation``)."""

# what needs the analysis extra (matplotlib, scipy), in its message (fairseq_tying.common.extras)
FOR_WHAT = "comparing runs (fairseq_tying.studies: the reports, their statistics and plots)"
