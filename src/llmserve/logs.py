"""The server's log format, set once per process (the supervisor and each API process)."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, tag: str = "") -> None:
    """`tag` names the process in a group of API processes, e.g. `api-1`."""
    logging.basicConfig(
        level=level.upper(), format=(f"[{tag}] " if tag else "") + LOG_FORMAT, stream=sys.stderr
    )
