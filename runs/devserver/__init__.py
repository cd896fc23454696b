"""Local model servers that speak the providers' real protocols over HTTP.

`ChatCompletionsServer` (OpenAI Chat Completions, what vLLM, Ollama, LM Studio
and LiteLLM serve too) and `MessagesServer` (Anthropic Messages), both with SSE
streaming. The tests run the real adapters against them (errors, rate limits,
dropped and endless streams included: `Behaviour`); the demo runs one as a
scripted OpenAI-compatible endpoint so an agent defined through the API works
without an API key:

    python -m runs.devserver --protocol openai --port 8011 --script script.json

Pure Python (no Django): usable from tests, management commands and a shell.
"""

from runs.devserver.base import Behaviour, ModelServer, Reply
from runs.devserver.chat_completions import ChatCompletionsServer
from runs.devserver.messages_api import MessagesServer

SERVERS: dict[str, type[ModelServer]] = {
    "openai": ChatCompletionsServer,
    "anthropic": MessagesServer,
}

__all__ = [
    "SERVERS",
    "Behaviour",
    "ChatCompletionsServer",
    "MessagesServer",
    "ModelServer",
    "Reply",
]
