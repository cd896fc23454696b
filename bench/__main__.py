"""`make bench`: run every bench/bench_*.py module's main() in turn."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main() -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    selected = [n for n in names if not sys.argv[1:] or n in sys.argv[1:]]
    for name in selected:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        importlib.import_module(f"bench.{name}").main()
        print(f"--- {name} took {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
