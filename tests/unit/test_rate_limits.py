"""Per-key requests and tokens per minute: token buckets, reservation and refund, OpenAI headers."""

from __future__ import annotations

import json

import pytest
from loadtest.prom import Scrape

from llmserve.config import AuthConfig, parse_overrides
from llmserve.errors import RateLimitedError
from llmserve.policy.rate_limits import KeyLimits, RateLimiter, TokenBucket
from tests.unit.conftest import MODEL, make_client


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_refills_at_its_per_minute_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(60, clock)
    assert bucket.try_take(60)
    assert not bucket.try_take(1)
    assert bucket.seconds_until(1) == pytest.approx(1.0)
    clock.now += 30
    assert bucket.level == pytest.approx(30)
    clock.now += 1000
    assert bucket.level == 60, "never above capacity"


def limits(limiter: RateLimiter, key_id: str) -> KeyLimits:
    key = limiter.limits_of(key_id)
    assert key is not None
    return key


def test_tokens_given_back_can_be_reserved_again() -> None:
    clock = FakeClock()
    key = limits(RateLimiter(AuthConfig(api_keys=["k"], tokens_per_minute=100), clock), "key")
    assert key.reserve_tokens(90) == 90
    with pytest.raises(RateLimitedError) as refused:
        key.reserve_tokens(20)
    assert refused.value.type == "tokens"
    assert refused.value.headers["Retry-After"] == "6"  # 10 missing at 100/min
    key.give_back_tokens(90 - 15)  # it used 15
    assert key.reserve_tokens(80) == 80


def test_keys_have_their_own_buckets_and_no_key_has_no_limits() -> None:
    limiter = RateLimiter(AuthConfig(api_keys=["k"], requests_per_minute=1), FakeClock())
    limits(limiter, "a").take_request()
    with pytest.raises(RateLimitedError):
        limits(limiter, "a").take_request()
    limits(limiter, "b").take_request()
    assert limiter.limits_of(None) is None
    assert RateLimiter(AuthConfig(api_keys=["k"]), FakeClock()).limits_of("a") is None


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_AUTH__API_KEYS", json.dumps(["sk-a", "sk-b"]))


def post(client, key: str, **fields: object):  # type: ignore[no-untyped-def]
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 2, **fields}
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


@pytest.mark.usefixtures("keys")
def test_requests_per_minute_over_http() -> None:
    with make_client(parse_overrides(["auth.requests_per_minute=2"])) as client:
        first = post(client, "sk-a")
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert post(client, "sk-a").status_code == 200
        refused = post(client, "sk-a")
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
        assert post(client, "sk-b").status_code == 200, "another key has its own limit"
        scrape = Scrape.parse(client.get("/metrics").text)
        assert scrape.value("llmserve_rejections_total", reason="rate_limited") == 1


@pytest.mark.usefixtures("keys")
def test_tokens_per_minute_reserve_prompt_plus_max_tokens_and_refund_what_was_not_used() -> None:
    with make_client(parse_overrides(["auth.tokens_per_minute=60"])) as client:
        # reserves 2 + 50 = 52; stops after 2 tokens, so 4 are used and 48 refunded
        first = post(client, "sk-a", max_tokens=50, stop=["w2"])
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-tokens"] == "60"
        assert int(first.headers["x-ratelimit-remaining-tokens"]) == 8
        assert post(client, "sk-a", max_tokens=50, stop=["w2"]).status_code == 200, "the refund made room"
        refused = post(client, "sk-a", max_tokens=60)  # needs 62, about 52 are left
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "tokens"
        assert "needs 62" in refused.json()["error"]["message"]


def test_without_keys_there_are_no_per_key_limits() -> None:
    with make_client(parse_overrides(["auth.requests_per_minute=1"])) as client:
        for _ in range(3):
            assert (
                client.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1}
                ).status_code
                == 200
            )
