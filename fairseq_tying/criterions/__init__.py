"""Criterions registered with fairseq."""
