"""The run diff on a 1,000-step pair: two recorded runs of the demo agent whose
steps mostly agree (a few inserted, skipped and changed steps, another final
answer), diffed through GET /api/v1/runs/<a>/diff/<b>/ and rendered by the page
/runs/<a>/diff/<b>/ in real Chromium against Daphne.

Targets (2-core machine, issue 27): API < 1 s, page rendered < 1.5 s.

    python -m bench bench_diff
    BENCH_DIFF_STEPS=5000 python -m bench bench_diff
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from bench.bench_ui import CHROMIUM, PASSWORD, Daphne, _hex, logged_in_page
from bench.django_env import django_setup

TOOLS = ["lookup_order", "get_delivery_date", "search_catalogue", "check_stock"]


def _replies(steps: int, rng: random.Random) -> list[Any]:
    from tests.run_diff_data import Call, Reply

    replies = [
        Reply(f"step {i}", [Call(rng.choice(TOOLS), {"order_id": str(4000 + i % 97)},
                                 observation=f'{{"ok":true,"data":{{"n":{i}}}}}')])
        for i in range(steps - 1)
    ]  # fmt: skip
    replies.append(Reply("A replacement is on its way."))
    return replies


def _store_pair(steps: int) -> tuple[Any, Any, Any]:
    from django.contrib.auth import get_user_model

    from controlplane.services import membership_set, tenant_create
    from runs.demo import demo_seed_shop
    from runs.models import Agent
    from tests.run_diff_data import Call, Reply, seed_recorded_run

    tenant = tenant_create(slug=f"bench-{_hex(16)}", name="Bench diff")
    user = get_user_model().objects.create_user(
        username=f"bench-{_hex(16)}", password=PASSWORD
    )
    membership_set(tenant=tenant, user=user, role="operator")
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    rng = random.Random(27)
    left = _replies(steps, rng)
    right = list(left)
    # About 2% of steps differ each way: other arguments, an extra call, a
    # skipped call; and another final answer.
    for _ in range(steps // 50):
        at = rng.randrange(1, len(right) - 1)
        what = rng.choice(("args", "insert", "skip"))
        if what == "args":
            call = right[at].calls[0]
            right[at] = Reply(right[at].text, [Call(call.tool, {"order_id": "X"})])
        elif what == "insert":
            right.insert(at, Reply("again", [Call("check_stock", {"sku": "K1"})]))
        else:
            del right[at]
    right[-1] = Reply("We cannot ship a replacement.")
    return seed_recorded_run(agent, left), seed_recorded_run(agent, right), user


def main() -> None:
    steps = int(os.environ.get("BENCH_DIFF_STEPS", "1000"))
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    django_setup(os.environ.get("BENCH_DATABASE_URL"))
    from playwright.sync_api import sync_playwright

    t = time.monotonic()
    left, right, user = _store_pair(steps)
    print(f"stored two runs of {left.steps:,} and {right.steps:,} steps "
          f"in {time.monotonic() - t:.1f} s")  # fmt: skip
    diff_path = f"/runs/{left.id}/diff/{right.id}/"
    fetch = (
        "async () => { const r = await fetch('/api/v1" + diff_path + "');"
        " const b = await r.json(); return [r.status, b.pairs.length,"
        " b.first_divergence && b.first_divergence.pair]; }"
    )
    server = Daphne()
    r: dict[str, Any] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-background-networking",
                      "--disable-gpu"],
            )  # fmt: skip
            page = logged_in_page(browser, server.url, user.username)
            api_ms = []
            for _ in range(5):
                t = time.monotonic()
                status, pairs, first = page.evaluate(fetch)
                api_ms.append((time.monotonic() - t) * 1000)
                assert status == 200, status
            r["api_ms"], r["pairs"], r["first"] = api_ms, pairs, first
            renders = []
            for _ in range(3):  # cold navigations: the median is reported
                page.goto(diff_path)
                page.wait_for_function("() => window.cpRunDiff?.firstRender")
                renders.append(page.evaluate("() => window.cpRunDiff.firstRender"))
            r["render_ms"] = renders
            r["nodes"] = page.evaluate("() => document.querySelectorAll('*').length")
            browser.close()
    finally:
        server.stop()
    api = sorted(r["api_ms"])[len(r["api_ms"]) // 2]
    print(f"aligned pairs: {r['pairs']:,}; first divergence at pair {r['first']}")
    print("API GET /api/v1/runs/<a>/diff/<b>/ (in the browser), ms: "
          + ", ".join(f"{v:.0f}" for v in r["api_ms"])
          + f"; median {api:.0f} (target < 1000) "
          + ("OK" if api < 1000 else "OVER"))  # fmt: skip
    render = sorted(r["render_ms"])[1]
    print("rendered (navigation -> pairs drawn, divergence scrolled to), ms: "
          + ", ".join(f"{v:.0f}" for v in r["render_ms"])
          + f"; median {render:.0f} (target < 1500) "
          + ("OK" if render < 1500 else "OVER")
          + f"; {r['nodes']:,} DOM nodes")  # fmt: skip


if __name__ == "__main__":
    main()
