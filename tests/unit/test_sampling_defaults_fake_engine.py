"""The model's generation_config.json supplies defaults for the sampling fields a request omits, as
vLLM's `--generation-config auto` does; the request's own values always win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmserve.config import ConfigError, load_config
from llmserve.engine.base import SamplingDefaults
from llmserve.engine.transformers_engine import read_sampling_defaults
from llmserve.engine.vllm_engine import engine_arguments
from tests.fake_engine import FakeEngine
from tests.unit.conftest import MODEL, make_client

LLAMA3_INSTRUCT_DEFAULTS = SamplingDefaults(temperature=0.6, top_p=0.9, max_tokens=5)
USER_HI = [{"role": "user", "content": "hi"}]


def test_omitted_fields_take_the_models_defaults_and_given_ones_win() -> None:
    engine = FakeEngine(sampling_defaults=LLAMA3_INSTRUCT_DEFAULTS)
    with make_client(engine=engine) as client:
        body = {"model": MODEL, "messages": USER_HI}
        omitted = client.post("/v1/chat/completions", json=body).json()
        given = client.post("/v1/chat/completions", json={**body, "temperature": 1.0, "top_p": 1.0})
        completion = client.post("/v1/completions", json={"model": MODEL, "prompt": "a"})
    assert given.status_code == completion.status_code == 200
    assert omitted["usage"]["completion_tokens"] == 5, "max_new_tokens bounds chat's default length"
    from_model, from_request, completion_spec = engine.samplings[-3:]  # after the warm-up
    assert (from_model.temperature, from_model.top_p, from_model.top_k) == (0.6, 0.9, 0)
    assert (from_request.temperature, from_request.top_p) == (1.0, 1.0)
    # Completions default to 16 tokens in the request itself (OpenAI, vLLM); the model's
    # max_new_tokens does not shorten that, as in vLLM.
    assert completion_spec.max_tokens == 16
    assert completion_spec.temperature == 0.6


def test_generation_config_keys_map_to_request_fields() -> None:
    defaults = SamplingDefaults.from_generation_config(
        {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 256, "do_sample": True, "bos_token_id": 1}
    )
    assert defaults.in_effect() == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 256}
    assert SamplingDefaults.from_generation_config({}).in_effect() == {}


def test_the_baseline_engine_reads_them_like_vllm_and_the_switch_turns_them_off(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "bos_token_id": 1})
    )
    auto = load_config(None, {"engine": {"model": str(tmp_path)}}).engine
    assert read_sampling_defaults(auto).in_effect() == {"temperature": 0.6, "top_p": 0.9}
    off = auto.model_copy(update={"generation_config": "vllm"})
    assert read_sampling_defaults(off).in_effect() == {}
    overridden = auto.model_copy(update={"override_generation_config": {"temperature": 0.2}})
    assert read_sampling_defaults(overridden).temperature == 0.2


def test_priority_scheduling_reaches_vllms_engine_arguments() -> None:
    engine = load_config(None, {"engine": {"scheduling_policy": "priority"}}).engine
    assert engine_arguments(engine, MODEL)["scheduling_policy"] == "priority"


def test_the_switch_reaches_vllms_engine_arguments() -> None:
    engine = load_config(
        None, {"engine": {"generation_config": "vllm", "override_generation_config": {"top_k": 40}}}
    ).engine
    arguments = engine_arguments(engine, MODEL)
    assert arguments["generation_config"] == "vllm"
    assert arguments["override_generation_config"] == {"top_k": 40}


def test_the_stream_interval_reaches_vllms_engine_arguments_and_is_at_least_one() -> None:
    engine = load_config(None, {"engine": {"stream_interval": 4}}).engine
    assert engine_arguments(engine, MODEL)["stream_interval"] == 4
    assert engine_arguments(load_config(None, {}).engine, MODEL)["stream_interval"] == 1
    with pytest.raises(ConfigError):
        load_config(None, {"engine": {"stream_interval": 0}})
