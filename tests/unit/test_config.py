"""Configuration: profile < LLMSERVE_* env < CLI flags; unknown keys rejected clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmserve.config import ConfigError, default_profile_path, load_config, parse_overrides

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "configs").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def test_embedded_default_profile_is_the_repository_profile() -> None:
    assert default_profile_path().read_text() == (REPO / "configs" / "cpu-smollm2.yaml").read_text()


def test_default_profile_serves_smollm2_on_loopback_8000() -> None:
    config = load_config()
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8000)
    assert config.server.served_model_name == "SmolLM2-135M-Instruct"
    assert config.engine.model == Path(".cache/models/SmolLM2-135M-Instruct")
    assert config.engine.enforce_eager is True


@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
def test_every_profile_in_configs_is_valid(profile: Path) -> None:
    load_config(profile)


def test_env_overrides_profile_and_flags_override_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = write(tmp_path, "server: {port: 9000}\nengine: {max_num_seqs: 8, dtype: float32}\n")
    monkeypatch.setenv("LLMSERVE_SERVER__PORT", "9100")
    monkeypatch.setenv("LLMSERVE_ENGINE__MAX_NUM_SEQS", "16")
    config = load_config(profile, parse_overrides(["engine.max_num_seqs=32"]))
    assert config.server.port == 9100
    assert config.engine.max_num_seqs == 32
    assert config.engine.dtype == "float32"  # untouched profile values survive nested overrides


def test_unknown_profile_key_is_rejected_with_its_location(tmp_path: Path) -> None:
    profile = write(tmp_path, "engine:\n  max_num_seq: 8\n")
    with pytest.raises(ConfigError, match=r"engine\.max_num_seq: unknown key"):
        load_config(profile)


def test_unknown_top_level_section_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="servers: unknown key"):
        load_config(write(tmp_path, "servers: {}\n"))


def test_unknown_env_key_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSERVE_ENGINE__NOT_A_KNOB", "1")
    with pytest.raises(ConfigError, match=r"engine\.not_a_knob: unknown key"):
        load_config()


def test_invalid_value_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_config(write(tmp_path, "server: {port: 70000}\n"))


def test_invalid_yaml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "server: [unclosed\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_overrides_parse_yaml_scalars_and_reject_garbage() -> None:
    assert parse_overrides(["engine.enforce_eager=false", "server.port=1"]) == {
        "engine": {"enforce_eager": False},
        "server": {"port": 1},
    }
    with pytest.raises(ConfigError):
        parse_overrides(["no-equals-sign"])


def test_auto_dtype_on_cpu_is_bf16_only_where_the_cpu_computes_it_natively(tmp_path: Path) -> None:
    from llmserve.engine.dtype import cpu_has_native_bf16

    avx2_only = tmp_path / "avx2"
    avx2_only.write_text("flags\t: fpu sse avx avx2 fma\n")
    sapphire_rapids = tmp_path / "spr"
    sapphire_rapids.write_text("flags\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    assert not cpu_has_native_bf16(avx2_only)
    assert cpu_has_native_bf16(sapphire_rapids)
    assert not cpu_has_native_bf16(tmp_path / "missing")


def test_explicit_dtype_is_passed_through_unchanged() -> None:
    from llmserve.engine.dtype import resolve_dtype

    config = load_config(None, parse_overrides(["engine.dtype=bfloat16"]))
    assert resolve_dtype(config.engine) == "bfloat16"


def test_several_api_processes_need_the_vllm_engine_and_stay_within_bounds() -> None:
    with pytest.raises(ConfigError, match="api_processes > 1 shares one vLLM engine core"):
        load_config(None, {"server": {"api_processes": 2}, "engine": {"backend": "transformers"}})
    with pytest.raises(ConfigError, match=r"server\.api_processes"):
        load_config(None, {"server": {"api_processes": 0}})
    assert load_config(None, {"server": {"api_processes": 4}}).server.api_processes == 4
