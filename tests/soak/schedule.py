"""The soak's fault schedule: a pure function of a seed, the run's length, its fleet size and
its number of nodes.

Two streams, both drawn from one `random.Random(seed)`:

- faults, one at a time and at least `FAULT_GAP_S` apart, between the warm-up (the fleet joins)
  and the quiet tail (the fleet settles before the checks and the planned stop). Every kind of
  `kinds(nodes)` (`FAULT_KINDS`, and `CLUSTER_KINDS` with two nodes) comes once, in a drawn
  order, before any kind comes again, so a short run still meets each fault; kills of
  `gateway_sup`'s permanent children stay at `ROOT_KILLS_PER_WINDOW` in any `ROOT_WINDOW_S`
  (the root's own intensity, 10 in 60 s, is the node giving up on purpose, which
  tests/integration/test_root_intensity.py covers);
- operators' commands: a targeted SendCommand or a broadcast about every `COMMAND_EVERY_S`,
  over the whole run but the tail, so commands are in flight across every fault.

The seed is printed by the soak, so `--seed N` replays a failing run's schedule.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The faults of the single-node soak. Kills go through the remote console (runtime.kill, as an
# operator's kill: no terminate); the upstream faults act on the fake server.
OWNER_KILL = "owner_kill"
OWNER_MASS_KILL = "owner_mass_kill"
REGISTRY_KILL = "registry_kill"
ROUTER_KILL = "router_kill"
UPSTREAM_KILL = "upstream_kill"
HEARTBEAT_BUFFER_KILL = "heartbeat_buffer_kill"
UPSTREAM_DROP = "upstream_drop"
UPSTREAM_STALL = "upstream_stall"
UPSTREAM_RESTART = "upstream_restart"
# Memory in use pushed over the shedder's high-water mark for a hold, then let fall back.
SHEDDER_OVER = "shedder_over"
FAULT_KINDS = (
    OWNER_KILL,
    OWNER_MASS_KILL,
    REGISTRY_KILL,
    ROUTER_KILL,
    UPSTREAM_KILL,
    HEARTBEAT_BUFFER_KILL,
    UPSTREAM_DROP,
    UPSTREAM_STALL,
    UPSTREAM_RESTART,
    SHEDDER_OVER,
)
# The two-node variant's: the cluster link between the nodes cut (both ways, every byte dropped)
# for a hold, and node b SIGKILLed, then started again after a hold.
LINK_CUT = "link_cut"
PEER_KILL = "peer_kill"
CLUSTER_KINDS = (LINK_CUT, PEER_KILL)
# The registered name each kill of a permanent child of gateway_sup ends.
ROOT_KILLS = {
    REGISTRY_KILL: "registry",
    ROUTER_KILL: "router",
    UPSTREAM_KILL: "upstream",
    HEARTBEAT_BUFFER_KILL: "heartbeat_buffer",
}
# The faults that last `hold_s`.
HELD = (UPSTREAM_DROP, UPSTREAM_STALL, SHEDDER_OVER, LINK_CUT, PEER_KILL)
COMMAND = "command"
BROADCAST = "broadcast"

WARMUP_S = 15.0
TAIL_S = 20.0
FAULT_GAP_S = 6.0
FAULT_JITTER_S = 1.5
# A drop, a stall, the memory over the shedder's mark, a cut link or a killed peer lasts this
# long (drawn in the range): longer than a heartbeat flush and a few breaker failures, shorter
# than the agents' Register deadline.
HOLD_S = (2.0, 5.0)
ROOT_WINDOW_S = 60.0
ROOT_KILLS_PER_WINDOW = 4
COMMAND_EVERY_S = 3.0
# A targeted command names this many agents at most (each once).
COMMAND_TARGETS_MAX = 20
# The operators' command timeout: every target still owing an answer then gets TIMEOUT.
COMMAND_TIMEOUT_S = 10
# "Hundreds at once": this share of the fleet, under agent_sup's intensity (2000 in 10 s).
MASS_KILL_SHARE = 0.4
MASS_KILL_MAX = 1500


@dataclass(frozen=True, slots=True)
class Fault:
    """One event at `at_s` seconds after the fleet first joined. `size`: owners killed, or a
    command's targets (0: a broadcast); `hold_s`: how long a drop or stall lasts."""

    at_s: float
    kind: str
    size: int = 0
    hold_s: float = 0.0
    # Which pass through FAULT_KINDS this fault belongs to (0 first); commands are 0.
    cycle: int = 0


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    duration_s: float
    faults: tuple[Fault, ...]
    commands: tuple[Fault, ...]

    @property
    def events(self) -> tuple[Fault, ...]:
        """Faults and commands in time order (a fault first at the same instant)."""
        return tuple(sorted((*self.faults, *self.commands), key=lambda f: (f.at_s, f.kind)))


def kinds(nodes: int) -> tuple[str, ...]:
    """The fault kinds of a soak of `nodes` nodes (one or two)."""
    return FAULT_KINDS + (CLUSTER_KINDS if nodes > 1 else ())


def mass_kill_size(agents: int) -> int:
    return max(1, min(MASS_KILL_MAX, int(agents * MASS_KILL_SHARE)))


def _root_kill_allowed(kills: list[float], at_s: float) -> bool:
    return sum(1 for t in kills if at_s - t < ROOT_WINDOW_S) < ROOT_KILLS_PER_WINDOW


def _fault(rng: random.Random, kind: str, at_s: float, agents: int, cycle: int) -> Fault:
    if kind == OWNER_KILL:
        return Fault(at_s, kind, size=1, cycle=cycle)
    if kind == OWNER_MASS_KILL:
        return Fault(at_s, kind, size=mass_kill_size(agents), cycle=cycle)
    if kind in HELD:
        return Fault(at_s, kind, hold_s=round(rng.uniform(*HOLD_S), 3), cycle=cycle)
    return Fault(at_s, kind, cycle=cycle)


def _faults(rng: random.Random, duration_s: float, agents: int, nodes: int) -> tuple[Fault, ...]:
    faults: list[Fault] = []
    root_kills: list[float] = []
    bag: list[str] = []
    cycle = -1
    at_s = WARMUP_S
    end = duration_s - TAIL_S
    while at_s <= end:
        if not bag:
            bag = list(kinds(nodes))
            rng.shuffle(bag)
            cycle += 1
        # The first kind of the bag that the root's window allows now; none: a kill of owners.
        kind = next(
            (k for k in bag if k not in ROOT_KILLS or _root_kill_allowed(root_kills, at_s)),
            OWNER_KILL,
        )
        if kind in bag:
            bag.remove(kind)
        if kind in ROOT_KILLS:
            root_kills.append(at_s)
        fault = _fault(rng, kind, round(at_s, 3), agents, cycle)
        faults.append(fault)
        at_s += FAULT_GAP_S + fault.hold_s + rng.uniform(0.0, FAULT_JITTER_S)
    return tuple(faults)


def _commands(rng: random.Random, duration_s: float, agents: int) -> tuple[Fault, ...]:
    commands: list[Fault] = []
    at_s = WARMUP_S / 2
    while at_s <= duration_s - TAIL_S:
        if rng.random() < 0.25:
            commands.append(Fault(round(at_s, 3), BROADCAST))
        else:
            size = rng.randint(1, max(1, min(COMMAND_TARGETS_MAX, agents)))
            commands.append(Fault(round(at_s, 3), COMMAND, size=size))
        at_s += rng.uniform(0.5, 1.5) * COMMAND_EVERY_S
    return tuple(commands)


def build(seed: int, duration_s: float, agents: int, nodes: int = 1) -> Schedule:
    """The schedule of a run of `duration_s` seconds with `agents` agents on `nodes` nodes,
    drawn from `seed`."""
    if duration_s < WARMUP_S + TAIL_S:
        raise ValueError(f"a soak needs at least {WARMUP_S + TAIL_S:.0f} s")
    if agents < 1:
        raise ValueError("a soak needs at least one agent")
    if nodes not in (1, 2):
        raise ValueError("a soak runs one node or two")
    rng = random.Random(seed)
    faults = _faults(rng, duration_s, agents, nodes)
    return Schedule(seed, duration_s, faults, _commands(rng, duration_s, agents))
