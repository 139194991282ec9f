"""Hypothesis profiles: the suite is deterministic by default, so CI judges the change and not
the luck of the draw; `HYPOTHESIS_PROFILE=explore` searches fresh examples (docs/dev/testing.md)."""

from __future__ import annotations

import os

from hypothesis import settings

# derandomize: each test's examples derive from the test itself, the same on every run.
settings.register_profile("deterministic", derandomize=True)
# A wider random search, for a developer hunting counterexamples.
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
