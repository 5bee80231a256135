"""Option parsing for the locustfile, kept free of Locust's imports (which monkey-patch with gevent)."""

from __future__ import annotations

# Locust's row for a streamed response timed to its headers only; left out of summaries and plots.
STREAM_HEADERS_NAME = "/v1/completions stream: headers only"
USER_CLASS_NAMES = {"completion": "CompletionUser", "stream": "StreamingCompletionUser", "chat": "ChatUser"}


def parse_weights(text: str) -> dict[str, int]:
    """ "completion=3,stream=1,chat=0" -> weights per user class; unknown names are an error."""
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in USER_CLASS_NAMES:
            raise ValueError(f"unknown user class {name!r}; choose from {', '.join(USER_CLASS_NAMES)}")
        weights[name] = int(value or 1)
    if not any(weights.values()):
        raise ValueError("--user-weights gives every user class weight 0")
    return weights
