"""Models and architectures registered with fairseq."""
