"""POST /v1/traces never touches what is not the caller's: spans are the tenant's
own (one namespace per tenant), a native run's spans are refused and reported
as an OTLP partial success, and a retry updates an external span in place."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from django.test import Client
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from controlplane.models import AuditEvent
from controlplane.services import api_token_issue
from runs.models import Run
from runs.services import run_start
from tests.tracing.test_ingest import otlp_json, post
from tracing.models import RunEvent, Span


@pytest.fixture
def native_run(scripted_agent: Any, drive_run: Any) -> Run:
    """A finished native run of kettlecraft with its spans."""
    agent = scripted_agent([{"text": "done"}], [])
    return drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )


def snapshot(run: Run) -> list[dict[str, Any]]:
    return list(Span.objects.filter(run=run).order_by("pk").values())


def copy_of(span: Span, *, name: str, parent: str | None = None) -> dict[str, Any]:
    """An OTLP JSON span with `span`'s ids and different content."""
    return {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "parentSpanId": span.parent_span_id if parent is None else parent,
        "name": name,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "attributes": [{"key": "forged", "value": {"boolValue": True}}],
        "status": {"code": 2, "message": "overwritten"},
    }


def request_of(*spans: dict[str, Any]) -> bytes:
    body = otlp_json(0)
    body["resourceSpans"][0]["scopeSpans"][0]["spans"] = list(spans)
    return json.dumps(body).encode()


def as_protobuf(body: bytes) -> bytes:
    """The same request in the protobuf encoding (ids as bytes)."""
    document = json.loads(body)
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = _b64(span.get(key) or "")
    return ParseDict(document, ExportTraceServiceRequest()).SerializeToString()


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_a_rival_tenants_ingest_with_a_kettlecraft_spans_ids_leaves_it_untouched(
    native_run: Run, admin_user: Any, tenant: Any, other_tenant: Any,
    make_member: Any, api_client_for: Any, encoding: str,
) -> None:  # fmt: skip
    root = Span.objects.get(run=native_run, parent_span_id="")
    child = Span.objects.filter(run=native_run).exclude(parent_span_id="").first()
    assert child is not None
    before, events_before = snapshot(native_run), native_run.events.count()
    owner = api_client_for(admin_user, tenant)
    detail_before = owner.get(f"/api/v1/spans/{root.pk}/").json()
    rival_admin = make_member(other_tenant, "mallory", "admin")
    rival = api_token_issue(tenant=other_tenant, user=rival_admin).secret

    body = request_of(copy_of(root, name="pwned"), copy_of(child, name="pwned too"))
    if encoding == "json":
        response = post(Client(), body, secret=rival)
        assert response.status_code == 200, response.content
        # The answer for a trace id nobody uses: it tells the rival nothing.
        assert response.json() == {}
    else:
        response = post(
            Client(), as_protobuf(body), secret=rival,
            content_type="application/x-protobuf",
        )  # fmt: skip
        assert response.status_code == 200, response.content
        answer = ExportTraceServiceResponse.FromString(response.content)
        assert not answer.HasField("partial_success")

    # Kettlecraft's run and spans are exactly as they were.
    assert snapshot(native_run) == before
    assert native_run.events.count() == events_before
    again = owner.get(f"/api/v1/spans/{root.pk}/")
    assert again.status_code == 200 and again.json() == detail_before
    assert Run.objects.filter(tenant=tenant).count() == 1
    # The rival's spans live in the rival's own namespace, nowhere else: what
    # it sent, in a run of its own that only it can read.
    rival_run = Run.objects.get(tenant=other_tenant)
    assert rival_run.stop_reason == "external" and rival_run.id != native_run.id
    names = Span.objects.filter(run=rival_run).values_list("name", flat=True)
    assert sorted(names) == ["pwned", "pwned too"]
    assert not Span.objects.filter(run=native_run, name__startswith="pwned").exists()
    mine = api_client_for(rival_admin, other_tenant)
    assert mine.get(f"/api/v1/spans/{root.pk}/").status_code == 404
    assert mine.get(f"/api/v1/runs/{native_run.id}/spans/").status_code == 404


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_an_operator_token_cannot_replace_or_delete_a_native_runs_span(
    native_run: Run, operator_user: Any, admin_user: Any, tenant: Any,
    api_client_for: Any, encoding: str,
) -> None:  # fmt: skip
    root = Span.objects.get(run=native_run, parent_span_id="")
    before, events_before = snapshot(native_run), native_run.events.count()
    operator = api_token_issue(tenant=tenant, user=operator_user).secret
    # The native run's root, a new span in its trace, and an unrelated trace.
    body = request_of(
        copy_of(root, name="replaced"),
        {**copy_of(root, name="smuggled", parent=root.span_id),
         "spanId": "00000000000000ff"},
        {**copy_of(root, name="elsewhere", parent=""),
         "traceId": "5b8efff798038103d269b633813fc60c"},
    )  # fmt: skip
    if encoding == "json":
        response = post(Client(), body, secret=operator)
        assert response.status_code == 200, response.content
        partial = response.json()["partialSuccess"]
        rejected, message = int(partial["rejectedSpans"]), partial["errorMessage"]
    else:
        response = post(
            Client(), as_protobuf(body), secret=operator,
            content_type="application/x-protobuf",
        )  # fmt: skip
        assert response.status_code == 200, response.content
        partial = ExportTraceServiceResponse.FromString(
            response.content
        ).partial_success
        rejected, message = partial.rejected_spans, partial.error_message
    assert rejected == 2
    assert native_run.trace_id in message and "not accepted" in message

    assert snapshot(native_run) == before
    assert native_run.events.count() == events_before
    owner = api_client_for(admin_user, tenant)
    assert owner.get(f"/api/v1/spans/{root.pk}/").json()["name"] == root.name
    # Nothing of the native trace went anywhere else; the other trace was stored.
    assert list(
        Span.objects.exclude(run=native_run).values_list("name", flat=True)
    ) == ["elsewhere"]
    assert not Run.objects.filter(
        tenant=tenant, stop_reason="external", trace_id=native_run.trace_id
    ).exists()
    audit = AuditEvent.objects.get(tenant=tenant, action="otlp.spans_rejected")
    assert audit.actor == operator_user and audit.object_id == str(native_run.id)
    assert audit.after["rejected"] == 2


def test_a_retried_external_span_is_updated_in_place_and_keeps_its_key(
    admin_user: Any, tenant: Any, api_client_for: Any
) -> None:
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    first = otlp_json(2)
    assert post(Client(), json.dumps(first).encode(), secret=secret).status_code == 200
    run = Run.objects.get(tenant=tenant, stop_reason="external")
    keys = dict(Span.objects.filter(run=run).values_list("span_id", "pk"))
    retry = copy.deepcopy(first)
    retry["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["name"] = "renamed"
    response = post(Client(), json.dumps(retry).encode(), secret=secret)
    assert response.status_code == 200 and response.json() == {}
    assert dict(Span.objects.filter(run=run).values_list("span_id", "pk")) == keys
    client = api_client_for(admin_user, tenant)
    assert client.get(f"/api/v1/spans/{keys[f'{2:016x}']}/").json()["name"] == (
        "renamed"
    )
    assert Run.objects.filter(tenant=tenant).count() == 1
    assert RunEvent.objects.filter(run=run).count() == 4
