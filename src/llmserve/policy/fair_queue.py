"""The waiting room: requests served by priority, then fairly across API keys.

Start-time fair queuing: a key's request is tagged with the later of the queue's virtual time
and the finish tag of that key's previous request, and finishes `cost` (its tokens) later. The
queue serves the smallest tag, so a key that sends a burst gets its share, not the whole queue:
its later requests carry later tags than the first requests of the other keys. Without keys all
requests share one key and the queue is first come, first served. A lower `priority` number is
served first, as vLLM's priority scheduling orders it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    priority: int
    tag: float
    arrival: int
    item: T = field(compare=False)


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        self._entries: list[_Entry[T]] = []
        self._finish_tags: dict[str | None, float] = {}
        self._virtual_time = 0.0
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        """In the order they will be served."""
        return (entry.item for entry in sorted(self._entries))

    def push(self, item: T, key: str | None, cost: float, priority: int = 0) -> None:
        tag = max(self._virtual_time, self._finish_tags.get(key, 0.0))
        self._finish_tags[key] = tag + max(cost, 1.0)
        self._entries.append(_Entry(priority, tag, next(self._arrivals), item))

    def peek(self) -> T | None:
        return min(self._entries).item if self._entries else None

    def pop(self) -> T:
        entry = min(self._entries)
        self._entries.remove(entry)
        self._virtual_time = max(self._virtual_time, entry.tag)
        return entry.item

    def remove(self, item: T) -> None:
        self._entries = [entry for entry in self._entries if entry.item is not item]

    def ahead_of(self, item: T) -> list[T]:
        """The requests that will be served before `item`."""
        served = list(self)
        return served[: served.index(item)] if item in served else served
