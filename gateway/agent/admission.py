"""Admission under a storm: the shell of actors/core/admission.py for Register and Subscribe
(issue 19; seed 003, "Admission and scale"; docs/agent-plane.md "Admission under a storm").

One `AgentAdmission` per node (each node of a multi-node host has its own, as each has its own
loop and CPU to measure). A Register past its bound is refused before anything else is done for
it (no reservation, no permit, no upstream call); a Subscribe before its pending row is taken,
so the row stays for the agent's retry. The refusal is `RESOURCE_EXHAUSTED` (seed 003: "Each of
these refusals (`RESOURCE_EXHAUSTED`) tells the daemon when to come back") with the hint of the
core in `grpc-retry-pushback-ms`; an admitted call counts as pending until it ends, however it
ends, so the measured drain rate is the node's real one.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

from grpclib.const import Status

from actors.core.admission import Admission, AdmissionLimits, Admitted, Call
from gateway.agent.metrics import AgentMetrics
from gateway.config import Config
from gateway.config.keys.sessions import (
    ADMISSION_DRAIN_TARGET_MS,
    ADMISSION_HINT_MAX_MS,
    REGISTER_ADMISSION_PENDING_MAX,
    SUBSCRIBE_ADMISSION_PENDING_MAX,
)
from gateway.listeners.retry_hint import PUSHBACK_HEADER, HintedRefusal, RefusalKind

__all__ = ["REFUSED_DETAILS", "AdmissionRefusal", "AgentAdmission"]

REFUSED_DETAILS = "{call} refused: the gateway is busy; retry after grpc-retry-pushback-ms"
_PENDING = "pending"
# Not for security: the hints only have to differ between refusals.
_RANDOM = random.Random()


class AdmissionRefusal(HintedRefusal):
    """RESOURCE_EXHAUSTED with the admission's hint. A `HintedRefusal`, so `guarded` answers it
    with its trailers; its kind is the nearest one (a bounded queue), its range unused: the
    hint comes from the drain rate."""

    def __init__(self, call: Call, hint_ms: int) -> None:
        super().__init__(RefusalKind.PERMITS, REFUSED_DETAILS.format(call=call.value.title()))
        self.status = Status.RESOURCE_EXHAUSTED
        self.trailer = (PUSHBACK_HEADER, str(hint_ms))


class AgentAdmission:
    """Register's and Subscribe's admissions of one node (module doc)."""

    def __init__(
        self,
        register: AdmissionLimits,
        subscribe: AdmissionLimits,
        clock: Callable[[], float],
        rng: random.Random = _RANDOM,
    ) -> None:
        self._admissions = {
            Call.REGISTER: Admission(register),
            Call.SUBSCRIBE: Admission(subscribe),
        }
        self._clock = clock
        self._rng = rng

    @classmethod
    def of(cls, config: Config, clock: Callable[[], float]) -> AgentAdmission:
        target_s = config[ADMISSION_DRAIN_TARGET_MS] / 1000.0
        hint_max = config[ADMISSION_HINT_MAX_MS]

        def limits(pending_max: int) -> AdmissionLimits:
            return AdmissionLimits(pending_max, target_s, hint_max)

        return cls(
            limits(config[REGISTER_ADMISSION_PENDING_MAX]),
            limits(config[SUBSCRIBE_ADMISSION_PENDING_MAX]),
            clock,
        )

    def pending(self, call: Call) -> int:
        return self._admissions[call].pending

    @contextlib.contextmanager
    def admitted(self, call: Call, metrics: AgentMetrics) -> Iterator[None]:
        """Admit one call for the block, or raise its `AdmissionRefusal`; counted either way."""
        admission = self._admissions[call]
        label = call.value
        decision = admission.admit(self._clock(), self._rng.random())
        if not isinstance(decision, Admitted):
            metrics.admission_bound.labels(label).set(decision.bound)
            metrics.admission_refused.labels(label, _PENDING).inc()
            metrics.admission_hint.labels(label).observe(decision.hint_ms / 1000.0)
            raise AdmissionRefusal(call, decision.hint_ms)
        metrics.admission_admitted.labels(label).inc()
        metrics.admission_pending.labels(label).set(admission.pending)
        metrics.admission_bound.labels(label).set(admission.bound(self._clock()))
        try:
            yield
        finally:
            admission.finish(self._clock())
            metrics.admission_pending.labels(label).set(admission.pending)
