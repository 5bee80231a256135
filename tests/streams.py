"""A streaming completion read on a thread of its own, for tests that signal a server mid-stream."""

from __future__ import annotations

import threading

import httpx


class StreamReader(threading.Thread):
    """POSTs `body` with `stream: true` to `url` and keeps every SSE data line; `started` is set at
    the first one."""

    def __init__(self, url: str, body: dict[str, object], headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.headers = url, {**body, "stream": True}, headers or {}
        self.events: list[str] = []
        self.started = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, headers=self.headers, timeout=120) as response:
            for line in response.iter_lines():
                if line:
                    self.events.append(line.removeprefix("data: "))
                    self.started.set()
