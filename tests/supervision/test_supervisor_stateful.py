"""A state machine against a model of OTP's supervisor rules.

Hypothesis picks a strategy, restart types, intensity and period, then drives random child
exits (normal, shutdown, crash, kill), API calls and clock advances. After every step the
model says which children exist (in start order), which are running, which were
(re)started by the step, what the children recorded (terminations and starts, in order)
and whether the supervisor has given up; the real supervisor must agree.

The model's rules, OTP's:
- restart types: permanent always, transient unless `normal`/`shutdown`, temporary never
  (its spec removed; simple_one_for_one removes any child that is not restarted);
- a restart is counted at the supervisor's `now`; more than `intensity` inside `period`
  (a restart counts while `now - t < period`) and the supervisor stops the running
  children in reverse start order and exits with `reached_max_restart_intensity`;
- one_for_all / rest_for_one stop the running children of the group in reverse order
  (temporary ones are dropped), then start the whole group in order, including children
  that had been stopped (OTP's `start_children` starts every spec it holds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from supervisors import api
from supervisors.address import Address
from supervisors.messages import ChildExited
from supervisors.reason import NORMAL, SHUTDOWN
from supervisors.runtime import LoopSystemBase
from supervisors.supervisor import ChildSpec, SupFlags, SupSpec
from tests.support.actors import (
    Args,
    Child,
    ClockedSupervisor,
    Crash,
    Exit,
    ManualClock,
    settle_sync,
)

STRATEGIES = ["one_for_one", "one_for_all", "rest_for_one", "simple_one_for_one"]
RESTARTS = ["permanent", "transient", "temporary"]
ENDINGS = ["crash", "normal", "shutdown", "kill"]
# Endings by message: the child handles it (and records `terminate`) on its own turn.
END_MESSAGES = {"crash": Crash(), "normal": Exit(NORMAL), "shutdown": Exit(SHUTDOWN)}
MAX_DYNAMIC = 5


class SupervisorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.base = LoopSystemBase(self.loop)
        self.clock = ManualClock()
        self.events: list[tuple[Any, ...]] = []
        self.parent_inbox: list[Any] = []
        # The model.
        self.restart_of: dict[str, str] = {}  # id -> restart type, in start order
        self.running: set[str] = set()
        self.restarts: list[float] = []
        self.gave_up = False
        self.expected_events: list[tuple[Any, ...]] = []
        self.expected_new: set[str] = set()
        self.addresses: dict[str, Address] = {}
        self.dynamic = 0

    # -- helpers -----------------------------------------------------------------------------
    def run(self, coro: Any) -> Any:
        result = self.loop.run_until_complete(asyncio.wait_for(coro, 2.0))
        settle_sync(self.loop, self.base)
        return result

    def observed(self) -> list[tuple[str, Address | None]]:
        """(child id, address) in the supervisor's order, read through the API."""
        infos = self.run(api.which_children(self.base, self.sup, 2.0))
        out = []
        for info in infos:
            if info.id is not None:
                out.append((info.id, info.address))
            else:
                ref = self.base.ref(info.address)
                assert ref is not None, "a dynamic child listed but not alive"
                out.append((ref.instance.args.id, info.address))
        return out

    def snapshot(self) -> None:
        self.addresses = {i: a for i, a in self.observed() if a is not None}

    def begin_step(self) -> None:
        self.events.clear()
        self.expected_events = []
        self.expected_new = set()
        self.snapshot()

    @property
    def simple(self) -> bool:
        return self.strategy == "simple_one_for_one"

    def stop_in_reverse(self, ids: list[str]) -> None:
        for i in reversed(ids):
            if i in self.running:
                self.expected_events += [("exit_request", i), ("terminate", i, "shutdown")]
                self.running.discard(i)

    def model_child_ended(self, cid: str, normal: bool) -> set[str]:
        """Apply the exit of `cid`; return the ids whose own exit this step made moot
        (restarted or dropped by a group restart, or stopped when giving up)."""
        restart = self.restart_of[cid]
        self.running.discard(cid)
        if restart == "temporary" or (restart == "transient" and normal):
            if restart == "temporary" or self.simple:
                del self.restart_of[cid]
            return set()
        now = self.clock()
        self.restarts = [t for t in self.restarts if now - t < self.period] + [now]
        if len(self.restarts) > self.intensity:
            self.gave_up = True
            self.stop_in_reverse(list(self.restart_of))
            return set(self.restart_of)
        order = list(self.restart_of)
        if self.strategy in ("one_for_one", "simple_one_for_one"):
            group = [cid]
        elif self.strategy == "one_for_all":
            group = order
        else:
            group = order[order.index(cid) :]
        self.stop_in_reverse(group)
        for i in group:
            if i != cid and self.restart_of[i] == "temporary":
                del self.restart_of[i]
                continue
            self.running.add(i)
            self.expected_new.add(i)
            self.expected_events.append(("init", i))
        return set(group)

    def end_children(self, endings: list[tuple[str, str]]) -> None:
        """End the children together: each gets its message before the supervisor hears
        of any of them, so later exits reach it while it handles the first."""
        self.begin_step()
        for cid, ending in endings:
            address = self.addresses[cid]
            if ending == "kill":
                self.base.kill(address)  # at once; no terminate
                continue
            self.base.tell(address, END_MESSAGES[ending])
            self.expected_events.append(("terminate", cid, ending))
            self.running.discard(cid)
        settle_sync(self.loop, self.base)
        moot: set[str] = set()
        for cid, ending in endings:
            if cid not in moot:
                moot |= self.model_child_ended(cid, normal=ending in ("normal", "shutdown"))
            if self.gave_up:
                return

    # -- rules -------------------------------------------------------------------------------
    @initialize(
        strategy=st.sampled_from(STRATEGIES),
        restarts=st.lists(st.sampled_from(RESTARTS), min_size=1, max_size=5),
        intensity=st.integers(0, 3),
        period=st.sampled_from([1.0, 3.0, 10.0]),
    )
    def start(self, strategy: str, restarts: list[str], intensity: int, period: float) -> None:
        self.strategy = strategy
        self.intensity = intensity
        self.period = period
        self.parent = self.base.create_actor(None, Child, Args("parent", inbox=self.parent_inbox))
        if self.simple:
            self.template_restart = restarts[0]
            specs: tuple[ChildSpec, ...] = (
                ChildSpec("", Child, restart=restarts[0]),  # type: ignore[arg-type]
            )
        else:
            specs = tuple(
                ChildSpec(f"c{n}", Child, Args(f"c{n}", self.events), restart=r)  # type: ignore[arg-type]
                for n, r in enumerate(restarts)
            )
            for s in specs:
                self.restart_of[s.id] = s.restart
                self.running.add(s.id)
                self.expected_events.append(("init", s.id))
        flags = SupFlags(strategy, intensity, period)  # type: ignore[arg-type]
        parent_ref = self.base.ref(self.parent)
        self.sup = self.base.create_actor(
            parent_ref, ClockedSupervisor, (SupSpec(flags, specs), self.clock)
        )
        self.expected_new = set(self.running)
        self.addresses = {}

    @precondition(lambda self: not self.gave_up and self.running)
    @rule(data=st.data(), ending=st.sampled_from(ENDINGS))
    def child_ends(self, data: st.DataObject, ending: str) -> None:
        cid = data.draw(st.sampled_from(sorted(self.running)), label="child")
        self.end_children([(cid, ending)])

    @precondition(lambda self: not self.gave_up and len(self.running) >= 2)
    @rule(
        data=st.data(),
        first=st.sampled_from(sorted(END_MESSAGES)),
        second=st.sampled_from(sorted(END_MESSAGES)),
    )
    def two_children_end_together(self, data: st.DataObject, first: str, second: str) -> None:
        a, b = data.draw(
            st.lists(st.sampled_from(sorted(self.running)), min_size=2, max_size=2, unique=True),
            label="children",
        )
        self.end_children([(a, first), (b, second)])

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.5, 5.0]))
    def advance_clock(self, dt: float) -> None:
        self.clock.advance(dt)

    @precondition(lambda self: not self.gave_up and self.simple and len(self.running) < MAX_DYNAMIC)
    @rule()
    def start_dynamic_child(self) -> None:
        self.begin_step()
        cid = f"d{self.dynamic}"
        self.dynamic += 1
        address = self.run(api.start_child(self.base, self.sup, Args(cid, self.events), 2.0))
        assert self.base.is_alive(address)
        self.restart_of[cid] = self.template_restart
        self.running.add(cid)
        self.expected_new.add(cid)
        self.expected_events.append(("init", cid))

    @precondition(lambda self: not self.gave_up and self.restart_of)
    @rule(data=st.data())
    def terminate_child(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.restart_of)), label="child")
        self.begin_step()
        key: str | Address = self.addresses[cid] if self.simple else cid
        self.run(api.terminate_child(self.base, self.sup, key, 2.0))
        self.stop_in_reverse([cid])
        if self.simple or self.restart_of[cid] == "temporary":
            del self.restart_of[cid]

    @precondition(
        lambda self: not self.gave_up and not self.simple and set(self.restart_of) - self.running
    )
    @rule(data=st.data(), delete=st.booleans())
    def restart_or_delete_child(self, data: st.DataObject, delete: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(set(self.restart_of) - self.running)))
        self.begin_step()
        if delete:
            self.run(api.delete_child(self.base, self.sup, cid, 2.0))
            del self.restart_of[cid]
        else:
            self.run(api.restart_child(self.base, self.sup, cid, 2.0))
            self.running.add(cid)
            self.expected_new.add(cid)
            self.expected_events.append(("init", cid))

    # -- the checks --------------------------------------------------------------------------
    @invariant()
    def children_recorded_what_the_model_says(self) -> None:
        if not hasattr(self, "sup"):
            return
        assert self.events == self.expected_events

    @invariant()
    def the_supervisor_agrees_with_the_model(self) -> None:
        if not hasattr(self, "sup"):
            return
        exits = [
            (m.childAddress, m.reason.kind) for m in self.parent_inbox if isinstance(m, ChildExited)
        ]
        if self.gave_up:
            assert not self.base.is_alive(self.sup)
            assert exits == [(self.sup, "reached_max_restart_intensity")]
            assert len(self.base) == 1  # only the parent is left
            return
        assert self.base.is_alive(self.sup)
        assert exits == []
        observed = self.observed()
        assert [i for i, _ in observed] == list(self.restart_of)
        for cid, address in observed:
            assert (address is not None and self.base.is_alive(address)) == (cid in self.running), (
                cid
            )
            if address is None:
                continue
            before = self.addresses.get(cid)
            if cid in self.expected_new:
                assert address != before, f"{cid} should have been (re)started"
            else:
                assert address == before, f"{cid} should not have been touched"
        # Nothing else is alive: the parent, the supervisor and its running children.
        assert len(self.base) == 2 + len(self.running)

    def teardown(self) -> None:
        self.base.shutdown()
        self.loop.close()


TestSupervisorModel = SupervisorMachine.TestCase
TestSupervisorModel.settings = settings(
    max_examples=75,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
