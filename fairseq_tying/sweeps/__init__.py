"""The sweep model: a sweep file read and checked (sweepfile.py), its grid expanded into runs
(grid.py) of a Sweep (sweep.py: Sweep, Run, Resources), load_sweep (config.py), and the plateau
rule with what a run's folder says of it (plateau.py); launching runs is ``launch``'s, comparing
them ``studies``'."""
