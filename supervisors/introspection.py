"""What the remote console shows: every actor, the tree, one actor's redacted status.

Reads the runtime's records directly (no messages), so it answers even when an actor is
stuck. Status comes only from each actor's `format_status()`, never from its fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from supervisors.address import Address
from supervisors.runtime import ActorRef, LoopSystemBase


@attrs.frozen
class ActorInfo:
    address: Address
    cls: str
    name: str | None
    parent: Address | None
    children: tuple[Address, ...]
    mailbox: int


def info(ref: ActorRef) -> ActorInfo:
    return ActorInfo(
        address=ref.address,
        cls=ref.kind,
        name=ref.globalName,
        parent=None if ref.parent is None else ref.parent.address,
        children=tuple(ref.children or ()),
        mailbox=len(ref.mailbox or ()),
    )


def actors(system: LoopSystemBase) -> list[ActorInfo]:
    return [info(ref) for ref in system.refs()]


def status(system: LoopSystemBase, target: Address | str) -> Mapping[str, Any]:
    """An actor's own redacted summary; `target` is an address or a registered name."""
    address = system.whereis(target) if isinstance(target, str) else target
    ref = None if address is None else system.ref(address)
    if ref is None:
        raise LookupError(f"no such actor: {target}")
    summary = {
        "class": ref.kind,
        "name": ref.globalName,
        "mailbox": len(ref.mailbox or ()),
    }
    format_status = getattr(ref.instance, "format_status", None)
    if format_status is not None:
        summary.update(format_status())
    return summary


# Many simple_one_for_one children are summarised, not listed: a node holds thousands.
TREE_CHILDREN_SHOWN = 5


def tree(system: LoopSystemBase) -> str:
    """The supervision tree as indented text, one actor a line."""
    lines: list[str] = []

    def walk(ref: ActorRef, depth: int) -> None:
        mailbox = len(ref.mailbox or ())
        lines.append(f"{'  ' * depth}{ref.label} {ref.address} ({ref.kind}, mailbox {mailbox})")
        children = list((ref.children or {}).values())
        shown = (
            children if len(children) <= TREE_CHILDREN_SHOWN * 2 else children[:TREE_CHILDREN_SHOWN]
        )
        for child in shown:
            walk(child, depth + 1)
        if len(shown) < len(children):
            lines.append(f"{'  ' * (depth + 1)}... {len(children) - len(shown)} more")

    for address in system.primaries():
        ref = system.ref(address)
        if ref is not None:
            walk(ref, 0)
    return "\n".join(lines)
