"""The across-run engine: records into sections of typed cells, driven by the studies' specs."""
