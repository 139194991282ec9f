"""Hypothesis profiles: the suite is deterministic by default, so CI judges the change and not
the luck of the draw; `HYPOTHESIS_PROFILE=explore` searches fresh examples (docs/dev/testing.md)."""

from __future__ import annotations

import os

from hypothesis import settings

# derandomize: each test's examples derive from the test itself, the same on every run.
# No deadline: an example's time on a shared, loaded machine says nothing about the rule.
settings.register_profile("deterministic", derandomize=True, deadline=None)
# A wider random search, for a developer hunting counterexamples.
settings.register_profile("explore", derandomize=False, max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
