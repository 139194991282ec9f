"""The standing fault soak (`python -m tests.soak`; docs/dev/benchmarks.md, "The fault soak")."""
