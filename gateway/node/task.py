"""A task the node owns for as long as it runs (the loop monitor, the young generation's bound):
started once in `Node.start`, cancelled and awaited in `Node.stop`; a second `stop` is a no-op."""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import attrs

__all__ = ["NodeTask"]


@attrs.define
class NodeTask(abc.ABC):
    _task: asyncio.Task[None] | None = attrs.field(init=False, default=None)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    @abc.abstractmethod
    def start(self) -> None:
        """Spawn the task (`_spawn`) unless it runs already."""

    def _spawn(self, body: Coroutine[Any, Any, None], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(body, name=name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
