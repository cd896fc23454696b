"""`python -m runs.devserver`: serve a script over a provider's protocol until Ctrl-C.

The script is a JSON list of replies in the scripted model's format
(`{"text": ...}` or `{"tool_calls": [{"name": ..., "arguments": {...}}]}`); the
reply to a request is the entry at its number of assistant turns (the last one
again once the script runs out). `--demo` serves the demo's own script
(runs/devserver/demo.py) instead of a file, and answers requests for the model
`scripted-judge` as the demo suite's LLM judge (runs/devserver/judge.py).
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
from runs.devserver.demo import DEMO_JUDGE_MODEL, DEMO_WARRANTY_SCRIPT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runs.devserver")
    parser.add_argument("--protocol", choices=sorted(SERVERS), default="openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, help="a JSON file of replies")
    source.add_argument(
        "--demo", action="store_true", help="the demo's script (seed_demo --with-mcp)"
    )
    parser.add_argument("--model", default="", help="model name to answer with")
    parser.add_argument(
        "--judge-model",
        default="",
        help="answer requests for this model as the scripted eval judge "
        f"(--demo: {DEMO_JUDGE_MODEL})",
    )
    parser.add_argument(
        "--chunk-delay", type=float, default=0.03, help="seconds between stream events"
    )
    args = parser.parse_args(argv)
    script = DEMO_WARRANTY_SCRIPT if args.demo else json.loads(args.script.read_text())
    if not isinstance(script, list) or not script:
        parser.error("the script must be a non-empty JSON list of replies")
    server = SERVERS[args.protocol](
        script=script,
        host=args.host,
        port=args.port,
        chunk_delay=args.chunk_delay,
        model=args.model,
        judge_model=args.judge_model or (DEMO_JUDGE_MODEL if args.demo else ""),
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
