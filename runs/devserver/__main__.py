"""`python -m runs.devserver`: serve a script over a provider's protocol until Ctrl-C.

The script is a JSON list of replies in the scripted model's format
(`{"text": ...}` or `{"tool_calls": [{"name": ..., "arguments": {...}}]}`); the
reply to a request is the entry at its number of assistant turns (the last one
again once the script runs out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from pathlib import Path

from runs.devserver import SERVERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runs.devserver")
    parser.add_argument("--protocol", choices=sorted(SERVERS), default="openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--model", default="", help="model name to answer with")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.03, help="seconds between stream events"
    )
    args = parser.parse_args(argv)
    script = json.loads(args.script.read_text())
    if not isinstance(script, list) or not script:
        parser.error("the script must be a non-empty JSON list of replies")
    server = SERVERS[args.protocol](
        script=script,
        host=args.host,
        port=args.port,
        chunk_delay=args.chunk_delay,
        model=args.model,
    ).start()
    print(f"{args.protocol} model server on {server.base_url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with contextlib.suppress(KeyboardInterrupt):
        done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
