"""A server that answers every request at once with a canned completion: Locust's own ceiling.

    python -m loadtest.null_server --port 8100

Driving this instead of llmserve shows how many requests/s (and what p99) the load generator
itself can produce on this machine, so a load-test result limited by Locust is never mistaken
for the server's. A bare ASGI callable under uvicorn: no framework cost to measure.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

COMPLETION = json.dumps({
    "id": "cmpl-null", "object": "text_completion", "created": 0, "model": "null",
    "choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}).encode()  # fmt: skip
CHAT = json.dumps({
    "id": "chatcmpl-null", "object": "chat.completion", "created": 0, "model": "null",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}).encode()  # fmt: skip
STREAM = (
    b'data: {"choices":[{"index":0,"text":" ok","finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"text":" ok","finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if b'"stream": true' in body or b'"stream":true' in body:
        payload, content_type = STREAM, b"text/event-stream"
    else:
        payload, content_type = (
            (CHAT if scope["path"].endswith("chat/completions") else COMPLETION),
            b"application/json",
        )
    headers = [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
