"""Anthropic Messages (`POST /v1/messages`), JSON and SSE streaming."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runs.devserver.base import ModelServer, Reply

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class MessagesServer(ModelServer):
    """Speaks the Messages API as Anthropic does (events, pings, error events).

    Its `base_url` is what an Anthropic client is given (no `/v1`)."""

    protocol = "anthropic"

    def accepts(self, path: str) -> bool:
        return path.split("?")[0].rstrip("/").endswith("/v1/messages")

    def request_id_header(self) -> str:
        return "request-id"

    def error_json(self, status: int, message: str, kind: str) -> dict[str, Any]:
        kind = kind or {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _model(self, body: Mapping[str, Any]) -> str:
        return self.model or str(body.get("model") or "scripted")

    def _stop(self, reply: Reply) -> str:
        if reply.finish_reason:
            return STOP_REASONS.get(reply.finish_reason, reply.finish_reason)
        return "tool_use" if reply.tool_calls else "end_turn"

    def _id(self) -> str:
        return f"msg_{len(self.requests)}"

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for i, call in enumerate(reply.tool_calls):
            arguments = call.get("arguments", {})
            blocks.append(
                {
                    "type": "tool_use",
                    "id": str(call.get("id") or f"toolu_{len(self.requests)}_{i}"),
                    "name": call["name"],
                    "input": arguments
                    if isinstance(arguments, dict)
                    else json.loads(arguments or "{}"),
                    "_raw": reply.arguments(call),
                }
            )
        return blocks

    def _usage(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, int]:
        return {
            "input_tokens": reply.input_tokens or self.input_estimate(body),
            "output_tokens": reply.output_tokens or self.output_estimate(reply),
        }

    def render(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        content = [
            {k: v for k, v in block.items() if k != "_raw"}
            for block in self._blocks(reply)
        ]
        message: dict[str, Any] = {
            "id": self._id(),
            "type": "message",
            "role": "assistant",
            "model": self._model(body),
            "content": content,
            "stop_reason": self._stop(reply),
            "stop_sequence": None,
            "usage": self._usage(reply, body)
            if reply.usage
            else {"input_tokens": 0, "output_tokens": 0},
        }
        return message

    def events(self, reply: Reply, body: Mapping[str, Any]) -> list[bytes]:
        usage = (
            self._usage(reply, body)
            if reply.usage
            else {"input_tokens": 0, "output_tokens": 0}
        )
        frames: list[bytes] = [
            self.sse(
                {
                    "type": "message_start",
                    "message": {
                        "id": self._id(),
                        "type": "message",
                        "role": "assistant",
                        "model": self._model(body),
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {
                            "input_tokens": usage["input_tokens"],
                            "output_tokens": 1,
                        },
                    },
                },
                "message_start",
            ),
            self.sse({"type": "ping"}, "ping"),
        ]
        for index, block in enumerate(self._blocks(reply)):
            if block["type"] == "text":
                start: dict[str, Any] = {"type": "text", "text": ""}
                deltas = [
                    {"type": "text_delta", "text": piece}
                    for piece in self.pieces(block["text"])
                ]
            else:
                start = {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": {},
                }
                deltas = [
                    {"type": "input_json_delta", "partial_json": piece}
                    for piece in self.pieces(block["_raw"], 5)
                ]
            frames.append(
                self.sse(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": start,
                    },
                    "content_block_start",
                )
            )
            for delta in deltas:
                frames.append(
                    self.sse(
                        {"type": "content_block_delta", "index": index, "delta": delta},
                        "content_block_delta",
                    )
                )
            frames.append(
                self.sse(
                    {"type": "content_block_stop", "index": index}, "content_block_stop"
                )
            )
        frames.append(
            self.sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop(reply), "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
                "message_delta",
            )
        )
        frames.append(self.sse({"type": "message_stop"}, "message_stop"))
        return frames

    def stream_error_event(self, error: Mapping[str, Any]) -> bytes:
        return self.sse({"type": "error", "error": dict(error)}, "error")

    def endless_event(self, n: int, body: Mapping[str, Any]) -> bytes:
        return self.sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": f"more {n} "},
            },
            "content_block_delta",
        )
