"""Per-API-key limits: requests and tokens per minute, as token buckets, with OpenAI's headers.

A request takes one request token at once, and reserves prompt + max_tokens tokens when it has
been planned; when it ends, the reservation is settled to what it really used (prompt +
generated tokens) and the rest is refunded. A request refused before any work (by planning, by
admission, or because its client left while it queued) gives everything back. The request's
permit (policy/permits.py) does the taking and the giving back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmserve.config import AuthConfig
from llmserve.errors import RateLimitedError


class TokenBucket:
    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self.capacity = float(per_minute)
        self._refill_per_s = per_minute / 60.0
        self._clock = clock
        self._level = self.capacity
        self._updated_at = clock()

    @property
    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._updated_at) * self._refill_per_s)
        self._updated_at = now
        return self._level

    def try_take(self, amount: float) -> bool:
        if self.level < amount:
            return False
        self._level -= amount
        return True

    def give_back(self, amount: float) -> None:
        self._level = min(self.capacity, self.level + amount)

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
    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._requests_per_minute = config.requests_per_minute
        self._tokens_per_minute = config.tokens_per_minute
        self._clock = clock
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
                requests=self._bucket(self._requests_per_minute),
                tokens=self._bucket(self._tokens_per_minute),
            )
            self._keys[key_id] = limits
        return limits

    def _bucket(self, per_minute: int | None) -> TokenBucket | None:
        return TokenBucket(per_minute, self._clock) if per_minute is not None else None
