"""A logging filter that keeps bearer tokens out of every log line."""

from __future__ import annotations

import logging
import re

# "Authorization: Bearer <x>" / "Bearer <x>" in any text, and the plane's own token
# shape (cp_ + 43 URL-safe characters) wherever it appears on its own.
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;]+")
_PLANE_TOKEN = re.compile(r"\bcp_[A-Za-z0-9_-]{20,}")
MASK = "[REDACTED]"


def mask_tokens(text: str) -> str:
    return _PLANE_TOKEN.sub(MASK, _BEARER.sub(rf"\g<1>{MASK}", text))


class TokenMaskingFilter(logging.Filter):
    """Rewrites a record's message and traceback text with tokens masked.

    Attached to every handler in LOGGING: an exception message or a logged request
    line that quotes an Authorization header is written without the token.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_tokens(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_tokens(record.exc_text)
        if record.stack_info:
            record.stack_info = mask_tokens(record.stack_info)
        return True
