"""When the release supervisor starts a node that ended again: the policy, pure, time passed in.

- Exit 0 is a planned stop of that node alone (someone stopped it): it is left stopped, as
  an OTP `transient` child is.
- Exit 1 is a refused boot (gateway/__main__.py): a restart would only repeat it, so the node
  is left stopped and the refusal stays in its log (as the systemd unit's
  RestartPreventExitStatus=1).
- Anything else (2: its tree gave up; killed by a signal; a crash) is restarted after a
  backoff, 0.5 s doubling to 30 s per node, back to 0.5 s once the node has run 60 s.
- Restart intensity: more than 10 restarts within 60 s, all nodes together, means restarting
  does not help; the supervisor gives up and stops the others (an OTP supervisor reaching its
  intensity).

These numbers are this gateway's choices (the Erlang gateway runs one node per host under
systemd or a container runtime); docs/multinode.md lists them.
"""

from __future__ import annotations

from collections import deque

import attrs

EXIT_STOPPED = 0  # gateway/__main__.py: after a planned stop
EXIT_REFUSED = 1  # gateway/__main__.py: boot refused

BACKOFF_FIRST_S = 0.5
BACKOFF_CAP_S = 30.0
# A node that ran this long before it ended failed afresh: its backoff starts over.
STABLE_AFTER_S = 60.0
INTENSITY = 10
PERIOD_S = 60.0


@attrs.frozen
class Restart:
    """Start node `index` again after `delay_s`; `attempt` counts its quick failures in a row."""

    index: int
    delay_s: float
    attempt: int


@attrs.frozen
class Leave:
    """Node `index` stays stopped: `reason` says why."""

    index: int
    reason: str


@attrs.frozen
class GiveUp:
    """Restart intensity reached: stop every node and exit."""

    reason: str


Decision = Restart | Leave | GiveUp


@attrs.define
class RestartPolicy:
    intensity: int = INTENSITY
    period_s: float = PERIOD_S
    backoff_first_s: float = BACKOFF_FIRST_S
    backoff_cap_s: float = BACKOFF_CAP_S
    stable_after_s: float = STABLE_AFTER_S
    _started_at: dict[int, float] = attrs.field(factory=dict, init=False)
    _attempts: dict[int, int] = attrs.field(factory=dict, init=False)
    _restarts: deque[float] = attrs.field(factory=deque, init=False)

    def started(self, index: int, now: float) -> None:
        self._started_at[index] = now

    def exited(self, index: int, status: int, now: float) -> Decision:
        started_at = self._started_at.pop(index, now)
        if status == EXIT_STOPPED:
            return Leave(index, "stopped")
        if status == EXIT_REFUSED:
            return Leave(index, "boot refused")
        while self._restarts and now - self._restarts[0] >= self.period_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.intensity:
            return GiveUp(f"{len(self._restarts) + 1} restarts within {self.period_s:g} s")
        self._restarts.append(now)
        attempt = 1 if now - started_at >= self.stable_after_s else self._attempts.get(index, 0) + 1
        self._attempts[index] = attempt
        # The exponent is bounded: a node failing slowly for days must not overflow a float.
        delay = min(self.backoff_first_s * 2.0 ** min(attempt - 1, 64), self.backoff_cap_s)
        return Restart(index, delay, attempt)
