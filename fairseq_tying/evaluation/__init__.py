"""Evaluation: generation, sacrebleu scoring, significance tests, tables and plots."""
