"""Strict, fast JSON request bodies for the generation routes.

orjson refuses what Python's json module lets through and the tokenizer later chokes on:
lone UTF-16 surrogates, invalid UTF-8, NaN/Infinity literals, nesting deeper than 1024.
Such bodies become 400 invalid_json. A body declared as something other than JSON is 415;
a body without Content-Type is read as JSON (what `curl -d` users expect).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from llmserve.errors import UnsupportedMediaTypeError


class JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


def is_json_media_type(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


class JsonBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_json_handler(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            if content_type and not is_json_media_type(content_type):
                raise UnsupportedMediaTypeError(
                    f"Content-Type {content_type!r} is not supported: send the body as application/json."
                )
            scope = request.scope
            if not content_type:
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            return await handler(JsonRequest(scope, request.receive))

        return strict_json_handler
