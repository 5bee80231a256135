"""Per-API-key limits: requests and tokens per minute, as token buckets, with OpenAI's headers.

A request takes one request token at once, and reserves prompt + max_tokens tokens when it has
been planned; when it ends, the reservation is settled to what it really used (prompt +
generated tokens) and the rest is refunded. A request refused before any work (by planning, by
admission, or because its client left while it queued) gives everything back. The request's
permit (policy/permits.py) does the taking and the giving back. With several API processes
(server.api_processes) a key's buckets are shared by all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmserve.config import AuthConfig
from llmserve.errors import RateLimitedError
from llmserve.policy.shared_state import BucketCell, SharedState

REQUESTS, TOKENS = 0, 1


class TokenBucket:
    """A bucket of `per_minute` tokens, refilled continuously. Its level lives in a BucketCell:
    this process's own, or one shared by the group's API processes (policy/shared_state.py)."""

    def __init__(self, per_minute: int, clock: Callable[[], float], cell: BucketCell | None = None) -> None:
        self.capacity = float(per_minute)
        self._refill_per_s = per_minute / 60.0
        self._clock = clock
        self._cell = cell if cell is not None else BucketCell()

    def _refilled(self) -> tuple[float, float]:
        """(level now, now); the caller holds the cell's lock."""
        now = self._clock()
        level, updated_at = self._cell.read()
        if math.isnan(level):  # first use: full
            return self.capacity, now
        return min(self.capacity, level + (now - updated_at) * self._refill_per_s), now

    @property
    def level(self) -> float:
        with self._cell.lock:
            level, now = self._refilled()
            self._cell.write(level, now)
            return level

    def try_take(self, amount: float) -> bool:
        with self._cell.lock:
            level, now = self._refilled()
            taken = level >= amount
            self._cell.write(level - amount if taken else level, now)
            return taken

    def give_back(self, amount: float) -> None:
        with self._cell.lock:
            level, now = self._refilled()
            self._cell.write(min(self.capacity, level + amount), now)

    def seconds_until(self, amount: float) -> float:
        """Until `amount` is available (never, if it exceeds the capacity: then until full)."""
        missing = min(amount, self.capacity) - self.level
        return max(0.0, missing / self._refill_per_s)


def _duration(seconds: float) -> str:
    """OpenAI's reset format: '1s', '6m0s', '250ms'."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


@dataclass
class KeyLimits:
    """One key's buckets. The permit takes from them and gives back what a request did not use."""

    requests: TokenBucket | None
    tokens: TokenBucket | None

    def take_request(self) -> None:
        if self.requests is not None and not self.requests.try_take(1):
            raise RateLimitedError(
                f"Rate limit reached for requests: {int(self.requests.capacity)} per minute.",
                "requests",
                max(1, math.ceil(self.requests.seconds_until(1))),
                self.headers(),
            )

    def give_back_request(self) -> None:
        if self.requests is not None:
            self.requests.give_back(1)

    def reserve_tokens(self, tokens: int) -> int:
        """Take `tokens` (prompt + max_tokens) now; return how many were taken."""
        if self.tokens is None:
            return 0
        if not self.tokens.try_take(tokens):
            raise RateLimitedError(
                f"Rate limit reached for tokens: this request needs {tokens} (prompt + max_tokens), "
                f"{int(self.tokens.capacity)} per minute are allowed.",
                "tokens",
                max(1, math.ceil(self.tokens.seconds_until(tokens))),
                self.headers(),
            )
        return tokens

    def give_back_tokens(self, tokens: int) -> None:
        if self.tokens is not None and tokens > 0:
            self.tokens.give_back(tokens)

    def headers(self) -> dict[str, str]:
        headers = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.capacity))
            headers[f"x-ratelimit-remaining-{name}"] = str(int(bucket.level))
            headers[f"x-ratelimit-reset-{name}"] = _duration(bucket.seconds_until(bucket.capacity))
        return headers


class RateLimiter:
    def __init__(
        self,
        config: AuthConfig,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedState | None = None,
    ) -> None:
        self._requests_per_minute = config.requests_per_minute
        self._tokens_per_minute = config.tokens_per_minute
        self._clock = clock
        self._shared = shared
        self._keys: dict[str, KeyLimits] = {}

    @property
    def enabled(self) -> bool:
        return self._requests_per_minute is not None or self._tokens_per_minute is not None

    def limits_of(self, key_id: str | None) -> KeyLimits | None:
        """The key's buckets; None without a key or without limits."""
        if key_id is None or not self.enabled:
            return None
        limits = self._keys.get(key_id)
        if limits is None:
            limits = KeyLimits(
                requests=self._bucket(self._requests_per_minute, key_id, REQUESTS),
                tokens=self._bucket(self._tokens_per_minute, key_id, TOKENS),
            )
            self._keys[key_id] = limits
        return limits

    def _bucket(self, per_minute: int | None, key_id: str, bucket: int) -> TokenBucket | None:
        if per_minute is None:
            return None
        # With a group of API processes, a key's buckets are the group's, wherever it connects.
        cell = self._shared.bucket_cell(key_id, bucket) if self._shared is not None else None
        return TokenBucket(per_minute, self._clock, cell)
