"""The upstream circuit breaker: one per upstream client, shared by every upstream lane.

Rules of this file: everything that decides a breaker state lives here; nothing here does I/O or
reads a clock. Every method takes `now` (seconds, monotonic) and returns effects for the actor.

Theory of operation (seed: "Circuit breaker tuning", "What counts as a failure", "Stream Status
Notification > Probe", and the breaker items under "Known limits"; SPEC_INDEX CB-01..CB-15):

* CLOSED. Calls are admitted. `threshold` (5) consecutive failures open it. A success resets the
  run; a neutral result leaves the run as it is.
* OPEN. Every admission is refused (`circuit_open`: the caller answers UNAVAILABLE) for the reset
  timeout, 10 s at first. When it has passed the breaker goes HALF_OPEN (lazily, on the next call
  that passes `now`, or on `poll` from the actor's timer at `next_deadline()`).
* HALF_OPEN. Exactly one held stream-status notification may be out as the probe
  (`admit_notification`); every other notification is refused while it is out. Call-path RPCs
  (register, inventory, replay) are admitted by default: the seed OBSERVED a ProxyRegister that
  arrived while the probe was out being sent and driving the transition, and a replay RPC being
  "the half open probe that closed the breaker" (`BreakerPolicy.half_open_admits_calls`).
  The first decisive result of the period decides: a success closes the breaker and puts the
  reset timeout back to the base; a failure opens it again with the reset timeout doubled, capped
  at `circuit_breaker_max_reset_timeout_ms` (30 s). A neutral probe result frees the probe slot
  (the next held notification is probed at once) and changes nothing else: "A half open breaker
  that receives only request-fault answers or local failures stays half open until a real RPC or
  probe decides."
* Results are matched to the period they were admitted in through a `Ticket` (an epoch that moves
  on every transition). A result from an earlier period is ignored: "A probe result that arrives
  after the breaker has moved on to a later half-open period does not change the breaker", and
  "the late probe result left the breaker alone" after a ProxyRegister had closed it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Literal

import attrs

from actors.core import LogLine
from actors.core.backoff import Doubling

__all__ = [
    "HALF_OPENED",
    "OPENED",
    "PROBE_FAILED",
    "PROBE_SUCCEEDED",
    "REQUEST_FAULT_STATUSES",
    "RESET_TIMEOUT_RANGE_MS",
    "THRESHOLD_RANGE",
    "Admission",
    "Breaker",
    "BreakerPolicy",
    "Effect",
    "Lane",
    "ProbeReady",
    "PublishState",
    "ResultKind",
    "StaleTicketError",
    "State",
    "Ticket",
    "Transition",
    "Verdict",
    "classify",
    "classify_status",
    "policy_from_settings",
]


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Verdict(enum.Enum):
    """What one upstream result means to the breaker."""

    SUCCESS = "success"
    FAILURE = "failure"
    # Neither: the consecutive-failure run is not reset, a half-open breaker is not closed.
    NEUTRAL = "neutral"


class Lane(enum.Enum):
    """The upstream lane a result came from; two results classify differently by lane."""

    REGISTER = "register"
    INVENTORY = "inventory"
    REPLAY = "replay"
    NOTIFY = "notify"
    GUARDIAN = "guardian"
    HEARTBEAT_FLUSH = "heartbeat_flush"


class ResultKind(enum.Enum):
    """How an upstream call ended, as the actor saw it."""

    OK = "ok"
    STATUS = "status"  # the server answered a gRPC status; classify by its code
    UNACKNOWLEDGED = "unacknowledged"  # NotifyStreamStatus OK with acknowledged=false
    TRANSPORT = "transport"  # no connection, closed, econnrefused, REFUSED_STREAM (stream_error)
    TIMEOUT = "timeout"
    TLS = "tls"  # handshake failure (unknown_ca, bad_tls_options, ...)
    HTTP = "http"  # an HTTP-level error
    EXCEPTION = "exception"  # any other exception out of the client or transport
    PROBE_KILLED = "probe_killed"  # the probe worker missed notify_probe_timeout_ms
    ENCODE = "encode"  # the gateway's own encoder refused it (bad UTF-8, request_too_large)
    TOO_MANY_STREAMS = "too_many_streams"  # the gateway's HTTP/2 client refused it locally


GRPC_OK = 0
FAILED_PRECONDITION = 9
# INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE: "the server
# answering correctly" about a wrong request, so they say nothing about the server's health.
# RESOURCE_EXHAUSTED (8) is deliberately not here: "the only brake the gateway has until the
# server sends explicit backpressure".
REQUEST_FAULT_STATUSES = frozenset({3, 5, 6, 9, 11})

# Lanes that hold an upstream permit and re-ask after a local too_many_streams refusal.
_PERMIT_LANES = frozenset({Lane.REGISTER, Lane.INVENTORY, Lane.REPLAY})

_ALWAYS_FAILURE = frozenset(
    {
        ResultKind.TRANSPORT,
        ResultKind.TIMEOUT,
        ResultKind.TLS,
        ResultKind.HTTP,
        ResultKind.EXCEPTION,
        ResultKind.PROBE_KILLED,
    }
)


def classify_status(code: int, lane: Lane) -> Verdict:
    """A gRPC status answered by the server."""
    if lane is Lane.HEARTBEAT_FLUSH:
        return Verdict.NEUTRAL  # "A heartbeat flush never feeds the breaker."
    if code == GRPC_OK:
        return Verdict.SUCCESS
    if lane is Lane.REPLAY and code == FAILED_PRECONDITION:
        # The replay path's own rule, kept on purpose: FAILED_PRECONDITION there means the
        # presented session was superseded, an authoritative answer, so it counts as a success.
        return Verdict.SUCCESS
    if code in REQUEST_FAULT_STATUSES:
        return Verdict.NEUTRAL
    return Verdict.FAILURE


def classify(kind: ResultKind, lane: Lane, status: int | None = None) -> Verdict:
    """What a result means to the breaker (seed: "What counts as a failure"; "Known limits")."""
    if lane is Lane.HEARTBEAT_FLUSH:
        return Verdict.NEUTRAL
    if kind is ResultKind.STATUS:
        if status is None:
            raise ValueError("ResultKind.STATUS needs the status code")
        return classify_status(status, lane)
    if kind is ResultKind.OK:
        return Verdict.SUCCESS
    if kind is ResultKind.UNACKNOWLEDGED:
        # "A refusal is an answer, so it is not a failure, and the server recorded nothing, so it
        # is not a recovery either."
        return Verdict.NEUTRAL
    if kind is ResultKind.ENCODE:
        # It never left the gateway, so it says nothing about the server.
        return Verdict.NEUTRAL
    if kind is ResultKind.TOO_MANY_STREAMS:
        # A permit holder re-asks for a permit and nothing was sent, so it is not counted. The
        # stream-status lane "does not retry, that counts against the circuit breaker"; Guardian
        # forwards take no permit either and are treated the same (the seed is silent on them).
        return Verdict.NEUTRAL if lane in _PERMIT_LANES else Verdict.FAILURE
    if kind in _ALWAYS_FAILURE:
        return Verdict.FAILURE
    raise ValueError(f"unclassified result kind {kind!r}")  # pragma: no cover - enum is closed


# --- policy -------------------------------------------------------------------------------------

# The ranges of the three settings ("Circuit breaker tuning"). The keys, their environment
# overrides and the WARN for a bad value live in gateway/config/keys/breaker.py; the
# configuration layer checks and logs each value once, so the policy takes typed values.
THRESHOLD_RANGE = (1, 1000)
RESET_TIMEOUT_RANGE_MS = (100, 3_600_000)  # both reset timeouts: 100 ms to one hour


def _in_range(lo: float, hi: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not lo <= value <= hi:
            raise ValueError(f"{attribute.name} must be in {lo}..{hi}, got {value!r}")

    return check


@attrs.frozen
class BreakerPolicy:
    """The breaker's numbers (seed: "Circuit breaker tuning"), each with its reason."""

    # 5: a server that keeps failing gets at most 5 retries of a held notification before the
    # breaker opens and the single half-open probe takes over.
    threshold: int = attrs.field(default=5, validator=_in_range(*THRESHOLD_RANGE))
    # 10 s: the first open period; a success puts it back here, so a server that passes the probe
    # but fails registrations cycles at this interval with no growth (CB-15).
    base_s: float = attrs.field(default=10.0, validator=_in_range(0.1, 3600.0))
    # 30 s (300 s before #5695): bounds how long a recovered server waits for the next probe.
    cap_s: float = attrs.field(default=30.0, validator=_in_range(0.1, 3600.0))
    # True: call-path RPCs pass a half-open breaker and their result decides, as the seed
    # observed. False gives the textbook rule: in half-open only the one probe goes out.
    half_open_admits_calls: bool = True

    @property
    def backoff(self) -> Doubling:
        # "the effective maximum is never below the base"
        return Doubling(base_s=self.base_s, cap_s=self.cap_s)


def policy_from_settings(
    *, threshold: int, reset_timeout_ms: int, max_reset_timeout_ms: int
) -> BreakerPolicy:
    """The policy from the three settings as the configuration resolved them (already in
    range, or the default after a WARN naming the key). Read once, when the upstream actor
    starts."""
    # "the effective maximum is never below the base": the seed states the rule, not a warning,
    # so the maximum is lifted silently.
    return BreakerPolicy(
        threshold=threshold,
        base_s=reset_timeout_ms / 1000.0,
        cap_s=max(reset_timeout_ms, max_reset_timeout_ms) / 1000.0,
    )


# --- effects and tickets ------------------------------------------------------------------------


@attrs.frozen
class Transition:
    """The breaker changed state; log `line` (never rate limited)."""

    previous: State
    current: State
    reset_s: float
    line: LogLine


@attrs.frozen
class PublishState:
    """Write the state where readiness reads it without calling the actor (HL-04)."""

    state: State
    epoch: int
    reset_s: float


@attrs.frozen
class ProbeReady:
    """The half-open probe slot is free: the notification drain may send one probe now."""

    epoch: int


Effect = Transition | PublishState | ProbeReady


@attrs.frozen
class Ticket:
    """Proof of admission: the period (`epoch`) a call was admitted in, and whether it is the
    half-open probe. Hand it back to `record` with the call's verdict."""

    epoch: int
    probe: bool


Refusal = Literal["circuit_open", "probe_out"]


@attrs.frozen
class Admission:
    allowed: bool
    ticket: Ticket | None
    # "circuit_open" (open, or half-open with the probe out when calls are not admitted) or
    # "probe_out" (a notification while the half-open probe is out). The caller answers
    # UNAVAILABLE or holds the notification.
    refusal: Refusal | None
    effects: tuple[Effect, ...] = ()


class StaleTicketError(ValueError):
    """A ticket from a period this breaker has not reached: it was issued by another breaker."""


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# The transition lines (never rate limited). The seed quotes "Circuit breaker: OPEN (will probe in
# <ms>ms)" (WARN), "half_open -> closed (probe succeeded)" (INFO) and "half_open -> open (probe
# failed ...)" (WARN), and calls them all "the Circuit breaker: transitions", hence the common
# prefix. The open -> half_open line and the text after "probe failed" are this rebuild's.
OPENED = "Circuit breaker: OPEN (will probe in {ms}ms)"
HALF_OPENED = "Circuit breaker: open -> half_open (probing)"
PROBE_SUCCEEDED = "Circuit breaker: half_open -> closed (probe succeeded)"
PROBE_FAILED = "Circuit breaker: half_open -> open (probe failed{why}; will probe in {ms}ms)"


# --- the core -----------------------------------------------------------------------------------


@attrs.define
class Breaker:
    """Closed -> open after `threshold` consecutive failures; open -> half-open when the reset
    timeout passes; exactly one notification probe in half-open. Request faults are neutral. No
    clock inside: every method takes `now`."""

    policy: BreakerPolicy = attrs.field(factory=BreakerPolicy)
    state: State = State.CLOSED
    failures: int = 0  # consecutive failures while closed
    reset_s: float = attrs.field(
        default=attrs.Factory(lambda self: self.policy.base_s, takes_self=True)
    )
    opened_at: float = 0.0
    epoch: int = 0  # moves on every transition
    probe_out: bool = False

    # -- reading --

    @property
    def is_open(self) -> bool:
        """What /readyz checks: only OPEN fails it (HL-03)."""
        return self.state is State.OPEN

    def published(self) -> PublishState:
        return PublishState(self.state, self.epoch, self.reset_s)

    def next_deadline(self) -> float | None:
        """When the actor should call `poll` (the end of the open period), or None."""
        return self.opened_at + self.reset_s if self.state is State.OPEN else None

    # -- time --

    def poll(self, now: float) -> list[Effect]:
        """Open -> half-open once the reset timeout has passed."""
        if self.state is not State.OPEN or now < self.opened_at + self.reset_s:
            return []
        effects = self._move(State.HALF_OPEN, LogLine("info", HALF_OPENED))
        effects.append(ProbeReady(self.epoch))
        return effects

    # -- admission --

    def admit(self, now: float) -> Admission:
        """A call-path RPC (ProxyRegister, ProxyInventory, a replay, a Guardian forward)."""
        effects = tuple(self.poll(now))
        if self.state is State.CLOSED or (
            self.state is State.HALF_OPEN and self.policy.half_open_admits_calls
        ):
            return Admission(True, Ticket(self.epoch, probe=False), None, effects)
        if self.state is State.HALF_OPEN and not self.probe_out:
            self.probe_out = True
            return Admission(True, Ticket(self.epoch, probe=True), None, effects)
        return Admission(False, None, "circuit_open", effects)

    def admit_notification(self, now: float) -> Admission:
        """A held stream-status notification. Closed: sent as usual. Half-open: it is the probe
        if the slot is free, else it stays held. Open: it stays held."""
        effects = tuple(self.poll(now))
        if self.state is State.CLOSED:
            return Admission(True, Ticket(self.epoch, probe=False), None, effects)
        if self.state is State.OPEN:
            return Admission(False, None, "circuit_open", effects)
        if self.probe_out:
            return Admission(False, None, "probe_out", effects)
        self.probe_out = True
        return Admission(True, Ticket(self.epoch, probe=True), None, effects)

    # -- results --

    def record(
        self, ticket: Ticket, verdict: Verdict, now: float, reason: str = ""
    ) -> list[Effect]:
        """The result of an admitted call. `reason` (e.g. "econnrefused") goes into the reopen
        line only."""
        if ticket.epoch > self.epoch:
            raise StaleTicketError(f"ticket epoch {ticket.epoch} is ahead of {self.epoch}")
        effects = self.poll(now)
        if ticket.epoch != self.epoch:
            return effects  # admitted in an earlier period: that period is over
        if self.state is State.CLOSED:
            effects += self._closed_result(verdict, now)
        elif self.state is State.HALF_OPEN:
            effects += self._half_open_result(ticket, verdict, now, reason)
        return effects

    def _closed_result(self, verdict: Verdict, now: float) -> list[Effect]:
        if verdict is Verdict.SUCCESS:
            self.failures = 0
        elif verdict is Verdict.FAILURE:
            self.failures += 1
            if self.failures >= self.policy.threshold:
                self.reset_s = self.policy.base_s
                return self._open(now, OPENED.format(ms=_ms(self.reset_s)))
        return []

    def _half_open_result(
        self, ticket: Ticket, verdict: Verdict, now: float, reason: str
    ) -> list[Effect]:
        if verdict is Verdict.SUCCESS:
            self.reset_s = self.policy.base_s
            self.failures = 0
            return self._move(State.CLOSED, LogLine("info", PROBE_SUCCEEDED))
        if verdict is Verdict.FAILURE:
            self.reset_s = self.policy.backoff.after(self.reset_s)
            why = f": {reason}" if reason else ""
            return self._open(now, PROBE_FAILED.format(why=why, ms=_ms(self.reset_s)))
        if ticket.probe:
            # A neutral probe (request fault, encode error, acknowledged=false, ...) decides
            # nothing; free the slot so the next held notification is probed at once.
            self.probe_out = False
            return [ProbeReady(self.epoch)]
        return []

    # -- transitions --

    def _open(self, now: float, text: str) -> list[Effect]:
        self.opened_at = now
        self.failures = 0
        return self._move(State.OPEN, LogLine("warning", text))

    def _move(self, to: State, line: LogLine) -> list[Effect]:
        previous = self.state
        self.state = to
        self.epoch += 1
        self.probe_out = False  # a probe of the old period no longer holds the slot
        return [Transition(previous, to, self.reset_s, line), self.published()]
