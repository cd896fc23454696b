from __future__ import annotations

import pytest
from django.test import Client

from controlplane.celery import app as celery_app


@pytest.mark.worker
def test_healthz_is_200_when_database_redis_and_a_worker_answer(celery_worker_process):
    response = Client().get("/healthz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "database": "ok",
        "redis": "ok",
        "worker": "ok",
        "status": "ok",
    }


@pytest.mark.django_db
def test_healthz_is_503_naming_the_worker_when_none_answers(settings):
    settings.HEALTH_WORKER_TIMEOUT = 0.2
    response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["redis"] == "ok"
    assert body["worker"].startswith("error")
    assert body["status"] == "error"


@pytest.mark.django_db
def test_healthz_is_503_naming_redis_when_the_broker_is_down(monkeypatch):
    from controlplane.embedded_redis import free_local_port

    monkeypatch.setattr(
        celery_app.conf, "broker_url", f"redis://127.0.0.1:{free_local_port()}/0"
    )
    response = Client().get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["redis"].startswith("error")
    assert body["worker"] == "error: no redis"
    assert body["database"] == "ok"


@pytest.mark.django_db
def test_livez_answers_asking_neither_database_nor_redis(
    monkeypatch, django_assert_num_queries
):
    from controlplane.embedded_redis import free_local_port

    monkeypatch.setattr(
        celery_app.conf, "broker_url", f"redis://127.0.0.1:{free_local_port()}/0"
    )
    with django_assert_num_queries(0):
        response = Client().get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_200_with_no_worker_while_healthz_reports_the_worker(settings):
    settings.HEALTH_WORKER_TIMEOUT = 0.2
    ready = Client().get("/readyz")
    assert ready.status_code == 200, ready.content
    assert ready.json() == {"database": "ok", "redis": "ok", "status": "ok"}
    report = Client().get("/healthz")
    assert report.status_code == 503
    assert report.json()["worker"].startswith("error")


@pytest.mark.django_db
def test_readyz_is_503_naming_redis_when_it_is_down(monkeypatch):
    from controlplane.embedded_redis import free_local_port

    monkeypatch.setattr(
        celery_app.conf, "broker_url", f"redis://127.0.0.1:{free_local_port()}/0"
    )
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["redis"].startswith("error")
    assert body["database"] == "ok"
    assert body["status"] == "error"
