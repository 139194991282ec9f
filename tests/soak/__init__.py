"""The standing fault soak (`python -m tests.soak`; docs/dev/benchmarks.md, "`tests.soak`: the
standing fault soak")."""
