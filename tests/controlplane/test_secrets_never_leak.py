"""A planted secret's value appears nowhere a person, a log or a run can read:
not in any column of any table, the run's event stream, the API responses, the
pages, the audit log or the logs (tests/secrets_probe.py does the searching)."""

from __future__ import annotations

import base64
import logging
from typing import Any

from django.test import Client

from controlplane.models import AuditEvent
from controlplane.redaction import REDACTED
from controlplane.secrets import secret_value
from runs.demo import demo_seed_shop
from runs.services import run_start
from tests.runs.conftest import drive
from tests.secrets_probe import SecretProbe, captured_logs

# No credential pattern matches it: only the known-value layer can hide it.
VALUE = "plain-kettle-7Qx9-lantern-vw38-orchard-51ZA"


def test_a_planted_secret_is_found_nowhere(
    tenant: Any, admin_user: Any, api_client_for: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    api = api_client_for(admin_user, tenant)
    probe = SecretProbe(VALUE)
    with captured_logs() as logs:
        touched = {
            "PUT secret": api.put(
                "/api/v1/secrets/SHOP_KEY/", {"value": VALUE}, format="json"
            ),
            "PUT secret again": api.put(
                "/api/v1/secrets/SHOP_KEY/", {"value": VALUE}, format="json"
            ),
            "POST secret": api.post(
                "/api/v1/secrets/", {"name": "OTHER", "value": VALUE}, format="json"
            ),
            "PUT bad name": api.put(
                "/api/v1/secrets/1BAD/", {"value": VALUE}, format="json"
            ),
            "PUT bad length": api.put(
                "/api/v1/secrets/LONG/", {"value": VALUE * 400}, format="json"
            ),
        }
        assert [r.status_code for r in touched.values()] == [201, 200, 201, 400, 400]
        # Someone's code that logs what it should not: the second layer hides it.
        assert secret_value(tenant_id=tenant.id, name="SHOP_KEY") == VALUE
        logging.getLogger("careless").error("connecting with key %s", VALUE)
        try:
            raise RuntimeError(f"provider refused {VALUE}")
        except RuntimeError:
            logging.getLogger("careless").exception("call failed")

        run = run_start(
            tenant=tenant,
            agent_slug="kettlecraft-support",
            input="order 4821 arrived damaged",
            started_by=admin_user,
        )
        drive(run)
        touched |= {
            "GET secrets": api.get("/api/v1/secrets/"),
            "GET secret": api.get("/api/v1/secrets/SHOP_KEY/"),
            "GET audit": api.get("/api/v1/audit/"),
            "GET runs": api.get("/api/v1/runs/"),
            "GET run": api.get(f"/api/v1/runs/{run.id}/"),
            "GET events": api.get(f"/api/v1/runs/{run.id}/events/"),
            "GET spans": api.get(f"/api/v1/runs/{run.id}/spans/"),
            "GET export": api.get(f"/api/v1/runs/{run.id}/export/"),
            "DELETE secret": api.delete("/api/v1/secrets/OTHER/"),
        }
        page = Client()
        page.force_login(admin_user)
        touched["secrets page"] = page.get("/secrets/")
        touched["audit page"] = page.get("/audit/")
    for where, response in touched.items():
        assert response.status_code < 400 or where.startswith("PUT bad"), where
    for where, response in touched.items():
        probe.response(where, response)
    probe.logs(logs)
    probe.database()
    probe.assert_clean()
    assert "connecting with key [REDACTED]" in logs.getvalue()
    assert f"provider refused {REDACTED}" in logs.getvalue()
    assert AuditEvent.objects.filter(object_type="secret").count() == 4


def test_the_probe_finds_a_value_wherever_it_is_put(tenant: Any) -> None:
    """The search above can fail: a value written into a row, or in JSON form
    into a JSON column, is found and named by table and column."""
    AuditEvent.objects.create(
        tenant=tenant,
        action="leak",
        object_type="x",
        object_id="1",
        after={"note": f'he said "{VALUE}"'},
    )
    probe = SecretProbe(VALUE)
    probe.database()
    assert probe.found == ["controlplane_auditevent.after"]
    probe.text("base64", base64.b64encode(f"x:{VALUE}".encode()[2:]))
    assert "base64" in probe.found
    unknown = "never-handled-value-5Jk2-mossy-9vQe"  # not a secret of this process
    with captured_logs() as logs:
        logging.getLogger("careless").warning("oops %s", unknown)
    stray = SecretProbe(unknown)
    stray.logs(logs)
    assert stray.found == ["the logs"]
