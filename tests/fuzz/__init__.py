"""Hypothesis-driven hostile input against a real node, bounded for CI (docs/listeners.md)."""
