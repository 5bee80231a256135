"""Serving techniques proven on CPU with the real engine: speculative decoding (ngram with its
batch-size schedule, suffix decoding) is lossless under greedy sampling, alone and in a busy batch,
and counts its acceptances in /metrics; prefix caching hits on a repeated system prompt; the CPU
profiles pass vLLM's own engine-config validation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from loadtest.server_process import ServerProcess

from tests.integration.conftest import MODEL, running_servers

REPO = Path(__file__).resolve().parents[2]
# ngram with its batch-size schedule, and suffix decoding.
SPEC_PROFILES = ["configs/cpu-smollm2-spec-ngram.yaml", "configs/cpu-smollm2-spec-suffix.yaml"]
# Repetitive prompts (what ngram speculation is for) and ordinary ones.
PROMPTS = [
    "Repeat this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry,",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "Copy the sentence: The quick brown fox jumps over the lazy dog. The quick brown fox",
    "The capital of France is",
    "Write a short poem about the sea.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]
CHAT = [{"role": "user", "content": "Say the word 'hello' five times, separated by commas."}]


@pytest.fixture(scope="module")
def spec_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """Each speculative profile, in float32, where greedy output is the same whatever the batch
    (speculation verifies several tokens in one step; in bfloat16 that alone can flip near-ties)."""
    float32 = ("--set", "engine.dtype=float32")
    servers = {Path(profile).stem: ("--config", profile, *float32) for profile in SPEC_PROFILES}
    with running_servers(tmp_path_factory, servers) as started:
        yield started


@pytest.fixture(params=[Path(profile).stem for profile in SPEC_PROFILES])
def spec_server(request: pytest.FixtureRequest, spec_servers: dict[str, ServerProcess]) -> ServerProcess:
    return spec_servers[request.param]


def greedy_completion(server: ServerProcess, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 48, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


def greedy_chat(server: ServerProcess) -> str:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 40, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_speculation_is_lossless_under_greedy_sampling(
    fp32_server: ServerProcess, spec_server: ServerProcess
) -> None:
    for prompt in PROMPTS:
        assert greedy_completion(spec_server, prompt) == greedy_completion(fp32_server, prompt), prompt
    assert greedy_chat(spec_server) == greedy_chat(fp32_server)


def test_speculation_stays_lossless_as_the_batch_grows_past_the_schedules_steps(
    fp32_server: ServerProcess, spec_server: ServerProcess
) -> None:
    """24 at once: the ngram schedule drafts fewer tokens (then none) as the batch grows."""
    prompts = PROMPTS * 4
    expected = {prompt: greedy_completion(fp32_server, prompt) for prompt in PROMPTS}
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        answers = list(pool.map(lambda prompt: greedy_completion(spec_server, prompt), prompts))
    assert answers == [expected[prompt] for prompt in prompts]


def test_acceptance_counters_are_in_metrics(spec_server: ServerProcess) -> None:
    before = spec_server.scrape()
    greedy_completion(spec_server, PROMPTS[0])
    after = spec_server.scrape()
    drafts = after.value("vllm:spec_decode_num_drafts_total") - before.value(
        "vllm:spec_decode_num_drafts_total"
    )
    drafted = after.value("vllm:spec_decode_num_draft_tokens_total") - before.value(
        "vllm:spec_decode_num_draft_tokens_total"
    )
    accepted = after.value("vllm:spec_decode_num_accepted_tokens_total") - before.value(
        "vllm:spec_decode_num_accepted_tokens_total"
    )
    assert drafts > 0
    assert 0 < accepted <= drafted
    print(f"\non a repetitive prompt: {accepted:.0f}/{drafted:.0f} drafted tokens accepted")


def test_a_repeated_system_prompt_hits_the_prefix_cache(server: ServerProcess) -> None:
    system = "You are a support agent for ACME. " + " ".join(
        f"Rule {i}: be precise and kind." for i in range(60)
    )
    hits_before = server.metric("vllm:prefix_cache_hits_total")
    for question in ("How do I reset my password?", "Where is my order?"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 4}
        assert httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    # The second request reuses the system prompt's full KV blocks (hundreds of tokens).
    assert server.metric("vllm:prefix_cache_hits_total") - hits_before >= 256


@pytest.mark.parametrize(
    "profile",
    [
        "cpu-smollm2.yaml",
        "cpu-smollm2-spec-ngram.yaml",
        "cpu-smollm2-spec-suffix.yaml",
        "sim-h200-smollm2.yaml",
    ],
)
def test_cpu_profiles_pass_vllms_own_engine_config_validation(profile: str) -> None:
    from llmserve.config import load_config
    from llmserve.engine.vllm_engine import apply_process_environment, build_engine_args

    config = load_config(REPO / "configs" / profile)
    saved = dict(os.environ)
    try:
        apply_process_environment(config.engine)
        vllm_config = build_engine_args(config.engine, config.server.served_model_name).create_engine_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert vllm_config.model_config.max_model_len == config.engine.max_model_len
    if config.engine.speculative is None:
        assert vllm_config.speculative_config is None
    else:
        assert vllm_config.speculative_config is not None
        spec, ours = vllm_config.speculative_config, config.engine.speculative
        assert spec.method == ours.method
        assert spec.num_speculative_tokens == ours.num_speculative_tokens
        schedule = ours.num_speculative_tokens_per_batch_size
        assert spec.num_speculative_tokens_per_batch_size == (schedule and [tuple(r) for r in schedule])
