"""The agent plane's admission shell (gateway/agent/admission.py): a refusal is
RESOURCE_EXHAUSTED with the core's hint in its trailer, and every decision is counted."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from prometheus_client import CollectorRegistry

from actors.core.admission import FLOOR, AdmissionLimits, Call
from gateway.agent.admission import AdmissionRefusal, AgentAdmission
from gateway.agent.metrics import agent_metrics
from gateway.listeners.retry_hint import PUSHBACK_HEADER, HintedRefusal

LIMITS = AdmissionLimits(pending_max=1, drain_target_s=2.0, hint_max_ms=5000)
WIDE = AdmissionLimits(pending_max=FLOOR, drain_target_s=2.0, hint_max_ms=5000)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    assert sample is not None, name
    return sample


def test_past_the_bound_a_call_is_refused_with_the_hint_and_counted() -> None:
    registry = CollectorRegistry()
    metrics = agent_metrics(registry, lambda: 0)
    admission = AgentAdmission(LIMITS, WIDE, clock=lambda: 100.0)
    with admission.admitted(Call.REGISTER, metrics):
        assert value(registry, "yuzu_gw_admission_pending", call="register") == 1
        with pytest.raises(AdmissionRefusal) as caught, admission.admitted(Call.REGISTER, metrics):
            pass
        # Subscribes have their own bound.
        with admission.admitted(Call.SUBSCRIBE, metrics):
            pass
    refusal = caught.value
    assert isinstance(refusal, HintedRefusal)  # `guarded` answers it with its trailers
    assert refusal.status is Status.RESOURCE_EXHAUSTED
    key, hint = refusal.trailer
    assert key == PUSHBACK_HEADER and 250 <= int(hint) <= 5000
    assert value(registry, "yuzu_gw_admission_pending", call="register") == 0
    assert value(registry, "yuzu_gw_admission_admitted_total", call="register") == 1
    assert value(registry, "yuzu_gw_admission_admitted_total", call="subscribe") == 1
    assert (
        value(registry, "yuzu_gw_admission_refused_total", call="register", reason="pending") == 1
    )
    assert value(registry, "yuzu_gw_admission_hint_seconds_count", call="register") == 1
    assert admission.pending(Call.REGISTER) == 0


def test_a_call_that_raises_still_finishes() -> None:
    metrics = agent_metrics(CollectorRegistry(), lambda: 0)
    admission = AgentAdmission(LIMITS, WIDE, clock=lambda: 0.0)
    with pytest.raises(RuntimeError), admission.admitted(Call.REGISTER, metrics):
        raise RuntimeError("the upstream call failed")
    assert admission.pending(Call.REGISTER) == 0
