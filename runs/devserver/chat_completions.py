"""OpenAI Chat Completions (`POST .../chat/completions`), JSON and SSE streaming."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.devserver.base import ModelServer, Reply, now


class ChatCompletionsServer(ModelServer):
    """Speaks Chat Completions as OpenAI does, `stream_options.include_usage` too.

    Its `base_url` is what an OpenAI client is given (it ends with `/v1`)."""

    protocol = "openai"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def accepts(self, path: str) -> bool:
        return path.rstrip("/").endswith("/chat/completions")

    def error_json(self, status: int, message: str, kind: str) -> dict[str, Any]:
        code = kind or {
            401: "invalid_api_key",
            429: "rate_limit_exceeded",
        }.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {
            "error": {"message": message, "type": code, "code": code, "param": None}
        }

    def _model(self, body: Mapping[str, Any]) -> str:
        return self.model or str(body.get("model") or "scripted")

    def _usage(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, int]:
        prompt = reply.input_tokens or self.input_estimate(body)
        completion = reply.output_tokens or self.output_estimate(reply)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _calls(self, reply: Reply, turn_id: str) -> list[dict[str, Any]]:
        return [
            {
                "id": str(call.get("id") or f"call_{turn_id}_{i}"),
                "type": "function",
                "function": {"name": call["name"], "arguments": reply.arguments(call)},
            }
            for i, call in enumerate(reply.tool_calls)
        ]

    def _finish(self, reply: Reply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    def _id(self, body: Mapping[str, Any]) -> str:
        return f"{len(self.requests)}"

    def render(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        turn = self._id(body)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = self._calls(reply, turn)
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": now(),
            "model": self._model(body),
            "choices": [
                {"index": 0, "message": message, "finish_reason": self._finish(reply)}
            ],
        }
        if reply.usage:
            completion["usage"] = self._usage(reply, body)
        return completion

    def _chunk(
        self, body: Mapping[str, Any], delta: dict[str, Any], finish: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{self._id(body)}",
            "object": "chat.completion.chunk",
            "created": now(),
            "model": self._model(body),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def events(self, reply: Reply, body: Mapping[str, Any]) -> list[bytes]:
        frames = [self._chunk(body, {"role": "assistant", "content": ""})]
        for piece in self.pieces(reply.text or ""):
            frames.append(self._chunk(body, {"content": piece}))
        for index, call in enumerate(self._calls(reply, self._id(body))):
            function = call["function"]
            frames.append(
                self._chunk(
                    body,
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": function["name"], "arguments": ""},
                            }
                        ]
                    },
                )
            )
            for piece in self.pieces(function["arguments"], 5):
                frames.append(
                    self._chunk(
                        body,
                        {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": piece}}
                            ]
                        },
                    )
                )
        frames.append(self._chunk(body, {}, self._finish(reply)))
        options = body.get("stream_options") or {}
        if reply.usage and options.get("include_usage"):
            usage = self._chunk(body, {})
            usage["choices"] = []
            usage["usage"] = self._usage(reply, body)
            frames.append(usage)
        return [self.sse(frame) for frame in frames] + [self.sse("[DONE]")]

    def stream_error_event(self, error: Mapping[str, Any]) -> bytes:
        return self.sse({"error": dict(error)})

    def endless_event(self, n: int, body: Mapping[str, Any]) -> bytes:
        return self.sse(self._chunk(body, {"content": f"more {n} "}))
