"""`make bench`: run every bench/bench_*.py module's main() in turn, each in its own
process (`python -m bench NAME` runs one in this one)."""

from __future__ import annotations

import importlib
import subprocess
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
    if len(selected) > 1:
        # One process each: Django reads its settings (the database a benchmark
        # set up) once per process, and a benchmark's children inherit its URL.
        failed = [
            name
            for name in selected
            if subprocess.run([sys.executable, "-m", "bench", name]).returncode
        ]
        if failed:
            print(f"\nfailed: {', '.join(failed)}")
        return 1 if failed else 0
    for name in selected:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        sys.argv = [f"bench/{name}.py"]  # each benchmark parses its own options
        importlib.import_module(f"bench.{name}").main()
        print(f"--- {name} took {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
