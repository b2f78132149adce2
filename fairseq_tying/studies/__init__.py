"""Comparing runs, in rooms by job: a run's record (records/), the statistics over seeds
(statistics/), the across-run engine and its specs (engine/), the views and reports (views/);
beside them the commands: ``answer`` for a sweep file, ``collect`` for the scores of a folder of
runs (commands.py), and a launch's summary of its sweep, the answer (sweep_summary.py). One
run is scored by ``fairseq_tying.evaluation``."""

# what needs the analysis extra (matplotlib, scipy), in its message (fairseq_tying.common.extras)
FOR_WHAT = "comparing runs (fairseq_tying.studies: the reports, their statistics and plots)"
