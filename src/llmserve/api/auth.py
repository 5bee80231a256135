"""Optional API keys: `Authorization: Bearer <key>`, stored and compared as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Header, Request

from llmserve.config import AuthConfig, ConfigError
from llmserve.errors import UnauthorizedError

DIGEST_PREFIX = "sha256:"
KEY_ID_CHARS = 16


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The digests of the accepted keys; never the keys themselves."""

    def __init__(self, digests: list[bytes]) -> None:
        self._digests = digests

    @classmethod
    def from_config(cls, config: AuthConfig) -> KeyRing | None:
        if not config.enabled:
            return None
        digests = [digest(key.get_secret_value()) for key in config.api_keys]
        if config.api_keys_file is not None:
            digests.extend(read_key_file(config.api_keys_file))
        if not digests:
            raise ConfigError("auth is configured but no API key was given")
        return cls(digests)

    def key_ids(self) -> list[str]:
        """Every accepted key's identity (what `identify` returns for it)."""
        return [known.hex()[:KEY_ID_CHARS] for known in self._digests]

    def identify(self, key: str) -> str | None:
        """The key's identity (a digest prefix, safe to log and to key limits by), if accepted."""
        candidate = digest(key)
        # Compare against every key, in constant time each, so timing says nothing about which.
        matches = [hmac.compare_digest(candidate, known) for known in self._digests]
        return candidate.hex()[:KEY_ID_CHARS] if any(matches) else None


def read_key_file(path: Path) -> list[bytes]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read auth.api_keys_file {path}: {exc.strerror}") from exc
    digests = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(DIGEST_PREFIX):
            try:
                value = bytes.fromhex(line.removeprefix(DIGEST_PREFIX))
            except ValueError:
                value = b""
            if len(value) != hashlib.sha256().digest_size:
                raise ConfigError(f"{path}:{number}: not a SHA-256 hex digest")
            digests.append(value)
        else:
            digests.append(digest(line))
    return digests


async def require_api_key(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> str | None:
    """The caller's key identity (None when keys are off); 401 without a valid key."""
    keys: KeyRing | None = request.app.state.keys
    if keys is None:
        return None
    if not authorization:
        raise UnauthorizedError("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    scheme, _, key = authorization.partition(" ")
    key_id = keys.identify(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
    if key_id is None:
        raise UnauthorizedError("Incorrect API key provided.")
    return key_id


ApiKeyRequired = Depends(require_api_key)
ApiKeyDep = Annotated[str | None, ApiKeyRequired]
