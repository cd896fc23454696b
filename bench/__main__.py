"""`make bench`: run every bench/bench_*.py module's main() in turn."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main() -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    wanted = sys.argv[1:]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"unknown benchmarks: {', '.join(unknown)}; known: {', '.join(names)}")
        return 2
    selected = [n for n in names if not wanted or n in wanted]
    for name in selected:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        sys.argv = [f"bench/{name}.py"]  # each benchmark parses its own options
        importlib.import_module(f"bench.{name}").main()
        print(f"--- {name} took {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
