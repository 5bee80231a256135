"""Typed configuration: a YAML profile, overridden by LLMSERVE_* env vars, overridden by CLI flags.

One `Config` object is built at start-up and passed down through constructors.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from llmserve.engine_config import EngineConfig

DEFAULT_PROFILE_NAME = "cpu-smollm2.yaml"
ENV_PREFIX = "LLMSERVE_"


class ConfigError(Exception):
    """A profile, env var or flag that cannot make a valid configuration."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    served_model_name: str = Field(default="SmolLM2-135M-Instruct", min_length=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_request_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Larger request bodies are refused with 413."
    )
    body_read_timeout_s: float = Field(
        default=10.0, gt=0, description="A request body slower than this is refused with 408 (slowloris)."
    )
    readiness_probe_ttl_s: float = Field(
        default=5.0, ge=0, description="How long a successful one-token readiness probe is trusted."
    )
    readiness_probe_timeout_s: float = Field(default=30.0, gt=0)
    engine_hang_timeout_s: float = Field(
        default=120.0, gt=0, description="A probe stuck this long means the engine hangs: exit non-zero."
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest a request may run; a request may ask for less."
    )
    shutdown_timeout_s: float = Field(
        default=30.0, gt=0, description="How long in-flight requests may run after SIGTERM."
    )
    api_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="HTTP processes sharing one listening socket and one vLLM engine core "
        "(docs/operations.md); more than 1 needs engine.backend vllm.",
    )


class AdmissionConfig(_Section):
    """Which requests the engine runs now, which wait, which are refused (docs/operations.md)."""

    enabled: bool = True
    max_in_flight: int = Field(default=64, ge=1, description="Engine sequences running at once.")
    max_waiting: int = Field(default=256, ge=0, description="Requests waiting for a slot.")
    max_waiting_prompt_tokens: int = Field(default=262_144, ge=0)
    queue_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest a request without an e2e target may wait."
    )
    max_queue_wait_s: float | None = Field(
        default=None,
        gt=0,
        description="Refuse at once a request whose forecast wait is longer, whatever its targets "
        "allow; unset: as long as they allow. Fewer refusals after waiting, a smaller burst absorbed.",
    )
    max_prompt_tokens: int | None = Field(
        default=None, ge=1, description="Longer prompts get 400 prompt_too_long (unset: the context)."
    )
    shed_by_estimate: bool = Field(
        default=True, description="Refuse at once a request whose predicted wait leaves it no time."
    )
    ready_steps: float = Field(
        default=2.0,
        ge=0,
        description="Where the batch limit is engine.max_num_seqs, admit this many engine steps' "
        "turnover beyond it, ready in vLLM's own queue for the slots finished requests free; 0: none.",
    )
    max_loop_lag_s: float | None = Field(
        default=None,
        gt=0,
        description="Refuse new requests at once while the API process's event loop runs this far "
        "behind (its own saturation); unset: a tenth of slo.e2e_s when that is set, else never.",
    )


class SloConfig(_Section):
    """Latency targets admission holds for each request it admits; unset: not enforced.

    A request admitted with an e2e target is one the model predicts to finish within it at the
    batch it joins; one that cannot meet it even alone is served best-effort."""

    e2e_s: float | None = Field(default=None, gt=0, description="Arrival to last token.")
    ttft_s: float | None = Field(default=None, gt=0, description="Arrival to first token.")
    tpot_s: float | None = Field(default=None, gt=0, description="Time per output token (engine step).")


class AuthConfig(_Section):
    """API keys: off when neither `api_keys` nor `api_keys_file` is set."""

    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Keys, e.g. LLMSERVE_AUTH__API_KEYS='[\"sk-1\"]'."
    )
    api_keys_file: Path | None = Field(
        default=None, description="One key (or `sha256:<hex digest>`) per line; # starts a comment."
    )
    protect_metrics: bool = False
    requests_per_minute: int | None = Field(default=None, ge=1, description="Per key; unset: no limit.")
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="Per key, prompt + max_tokens reserved, refunded to actual use."
    )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys) or self.api_keys_file is not None


class Config(BaseSettings):
    """The whole server configuration; see configs/cpu-smollm2.yaml for a commented profile."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    admission: AdmissionConfig = AdmissionConfig()
    slo: SloConfig = SloConfig()
    auth: AuthConfig = AuthConfig()
    engine: EngineConfig = EngineConfig()

    @model_validator(mode="after")
    def _api_processes_share_a_vllm_engine(self) -> Config:
        if self.server.api_processes > 1 and self.engine.backend != "vllm":
            raise ValueError("server.api_processes > 1 shares one vLLM engine core: engine.backend vllm")
        return self


def default_profile_path() -> Path:
    """The profile shipped inside the package (a copy of configs/cpu-smollm2.yaml)."""
    return Path(str(resources.files("llmserve").joinpath("profiles", DEFAULT_PROFILE_NAME)))


def read_profile(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config profile {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config profile {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config profile {path} must be a mapping at the top level")
    return data


def parse_overrides(assignments: list[str]) -> dict[str, Any]:
    """Turn ["engine.max_num_seqs=32", ...] into a nested dict; values are parsed as YAML scalars."""
    nested: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw_value = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE with a dotted key, got {assignment!r}")
        *parents, leaf = key.strip().split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        node[leaf] = yaml.safe_load(raw_value) if raw_value else ""
    return nested


def load_config(profile: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Build the Config: profile (default: the embedded one) < LLMSERVE_* env < overrides."""
    profile_path = profile or default_profile_path()
    profile_data = read_profile(profile_path)

    class _ProfileSource(PydanticBaseSettingsSource):
        def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
            return profile_data.get(field_name), field_name, False

        def __call__(self) -> dict[str, Any]:
            return dict(profile_data)

    class _LoadedConfig(Config):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _ProfileSource(settings_cls))

    try:
        loaded = _LoadedConfig(**dict(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, profile_path)) from None
    return Config.model_validate(loaded.model_dump())


def describe_validation_error(exc: ValidationError, profile_path: Path) -> str:
    lines = [f"invalid configuration (profile {profile_path}, env {ENV_PREFIX}*, flags):"]
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)
