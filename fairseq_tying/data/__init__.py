"""Data preparation: the embedded Bible corpus, standard benchmarks, subwords."""
