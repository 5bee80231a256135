"""The limits' state, in this process or shared by a group of API processes (server.api_processes).

With one API process the engine's load and the keys' token buckets are plain numbers. With N
processes over one engine core, each process admits and rate-limits its own requests, but against
the same numbers: the sequences and KV tokens the engine runs for all of them, and one bucket
pair per API key. Those live in shared memory created by the supervisor before it spawns the
processes, and every read-modify-write holds the group's lock (an uncontended lock costs well
under a microsecond; the engine step it guards is milliseconds).
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterable, MutableSequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

LOAD_SEQUENCES, LOAD_KV_TOKENS = 0, 1
BUCKET_FIELDS = 2  # level, updated_at
BUCKETS_PER_KEY = 2  # requests, tokens


class EngineLoad:
    """Sequences and KV tokens running in the engine for this server (all its API processes)."""

    def __init__(
        self, cells: MutableSequence[int] | None = None, lock: AbstractContextManager[Any] | None = None
    ):
        self._cells: MutableSequence[int] = cells if cells is not None else [0, 0]
        self._lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()

    @property
    def sequences(self) -> int:
        return self._cells[LOAD_SEQUENCES]

    @property
    def kv_tokens(self) -> int:
        return self._cells[LOAD_KV_TOKENS]

    def has_room(self, sequences: int, kv_tokens: int, limit: int, kv_capacity: int | None) -> bool:
        """A request fits beside what runs: within `limit` sequences and the KV capacity (alone
        it always fits)."""
        running = self._cells[LOAD_SEQUENCES]
        if running == 0:
            return True
        fits_kv = kv_capacity is None or self._cells[LOAD_KV_TOKENS] + kv_tokens <= kv_capacity
        return running + sequences <= limit and fits_kv

    def try_take(self, sequences: int, kv_tokens: int, limit: int, kv_capacity: int | None) -> bool:
        """Take room for a request if it has room (checked and taken under the lock)."""
        with self._lock:
            if not self.has_room(sequences, kv_tokens, limit, kv_capacity):
                return False
            self._cells[LOAD_SEQUENCES] += sequences
            self._cells[LOAD_KV_TOKENS] += kv_tokens
            return True

    def give_back(self, sequences: int, kv_tokens: int) -> None:
        with self._lock:
            self._cells[LOAD_SEQUENCES] -= sequences
            self._cells[LOAD_KV_TOKENS] -= kv_tokens


class BucketCell:
    """Where one token bucket keeps its level and the time it was last refilled."""

    def __init__(
        self,
        cells: MutableSequence[float] | None = None,
        offset: int = 0,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._cells: MutableSequence[float] = cells if cells is not None else [math.nan, math.nan]
        self._offset = offset
        self.lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()

    def read(self) -> tuple[float, float]:
        """(level, updated_at); NaN before the bucket's first use."""
        return self._cells[self._offset], self._cells[self._offset + 1]

    def write(self, level: float, updated_at: float) -> None:
        self._cells[self._offset] = level
        self._cells[self._offset + 1] = updated_at


@dataclass
class SharedState:
    """Created by the group's supervisor and handed to every API process it spawns (the arrays
    and locks travel to spawned children as multiprocessing handles)."""

    load_cells: MutableSequence[int]
    bucket_cells: MutableSequence[float]
    key_slots: dict[str, int]
    lock: Any
    calibration_lock: Any
    _load: EngineLoad | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def create(cls, key_ids: Iterable[str]) -> SharedState:
        context = multiprocessing.get_context("spawn")
        slots = {key_id: index for index, key_id in enumerate(dict.fromkeys(key_ids))}
        fields = max(1, len(slots)) * BUCKETS_PER_KEY * BUCKET_FIELDS
        return cls(
            load_cells=context.RawArray("q", 2),
            bucket_cells=context.RawArray("d", [math.nan] * fields),
            key_slots=slots,
            lock=context.Lock(),
            calibration_lock=context.Lock(),
        )

    def engine_load(self) -> EngineLoad:
        if self._load is None:
            self._load = EngineLoad(self.load_cells, self.lock)
        return self._load

    def bucket_cell(self, key_id: str, bucket: int) -> BucketCell | None:
        """The shared cell of a key's requests (0) or tokens (1) bucket; None for an unknown key."""
        slot = self.key_slots.get(key_id)
        if slot is None:
            return None
        offset = (slot * BUCKETS_PER_KEY + bucket) * BUCKET_FIELDS
        return BucketCell(self.bucket_cells, offset, self.lock)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_load"] = None
        return state
