"""Side-by-side benchmarks of pytest-tfmem and the alternatives: ``python benchmarks/run.py``."""
