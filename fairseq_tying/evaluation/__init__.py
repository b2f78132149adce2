"""Evaluating one run: generation, sacrebleu scoring, perplexity, checkpoint averaging and the
output matrix's row norms (runs are compared by ``fairseq_tying.studies``)."""
