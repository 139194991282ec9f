"""When a connection slot of the upstream channel dials again: a pure core, no clock, no I/O.

Rules (seed, "The upstream client > How calls use the channel"; SPEC_INDEX K22, UP-02):

* A lost connection, or a dial that failed, is dialled again after a delay that starts at
  100 ms and doubles per attempt up to 5 s.
* Up to 20 % jitter is added on top of that delay (never taken off), so a restarted server is
  not met by every gateway at the same instant. The longest delay is therefore 6 s (the seed
  rounds it to "about 5.8 s").
* The delay goes back to 100 ms only once a connection has stayed up for 5 s: a server that
  accepts and then drops every connection at once is not hammered every 100 ms.

The slot tells the core what happened (`connected`, `lost`, `failed`) with the loop's time and
sleeps for the delay it gets back. The random source is injected so tests fix it.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from actors.core.backoff import Doubling

__all__ = ["REDIAL", "Redial", "RedialPolicy"]


def _fraction(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be within 0..1, got {value!r}")


# 100 ms doubling to 5 s: quick after a blip, and at most one dial per slot every few seconds
# against a server that stays down.
DOUBLING = Doubling(base_s=0.100, cap_s=5.0)


@attrs.frozen
class RedialPolicy:
    doubling: Doubling = DOUBLING
    jitter: float = attrs.field(default=0.20, validator=_fraction)
    # How long a connection must have stayed up before the delay starts again from the base.
    stable_s: float = 5.0

    @property
    def max_delay_s(self) -> float:
        return self.doubling.effective_cap_s * (1.0 + self.jitter)


REDIAL = RedialPolicy()


@attrs.define
class Redial:
    """The redial delay of one connection slot.

    `random` returns a float in [0, 1) (`random.random`); it scales the jitter."""

    policy: RedialPolicy = REDIAL
    random: Callable[[], float] = attrs.field(kw_only=True)
    # The delay (before jitter) the next failure will wait.
    step_s: float = attrs.field(init=False)
    up_since: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.step_s = self.policy.doubling.base_s

    def connected(self, now: float) -> None:
        """A dial succeeded: the connection is up from `now`."""
        self.up_since = now

    def lost(self, now: float) -> float:
        """The connection that was up went down at `now`: the delay before dialling again."""
        if self.up_since is not None and now - self.up_since >= self.policy.stable_s:
            self.step_s = self.policy.doubling.base_s
        self.up_since = None
        return self._next_delay()

    def failed(self) -> float:
        """A dial failed (nothing came up): the delay before the next attempt."""
        self.up_since = None
        return self._next_delay()

    def _next_delay(self) -> float:
        step = self.step_s
        self.step_s = self.policy.doubling.after(step)
        draw = min(max(self.random(), 0.0), 1.0)
        return step * (1.0 + self.policy.jitter * draw)
