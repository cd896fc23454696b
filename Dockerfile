# One image for web (daphne), worker (celery) and beat; configured by environment only.
# The application is the installed wheel (no source tree beside it), so what runs is
# what `pip install` ships; tests/test_wheel_install.py builds and runs the same tree.
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=controlplane.settings \
    STATIC_ROOT=/opt/static \
    SANDBOX_ROOT=/var/lib/controlplane/sandbox
# bubblewrap: the sandbox's namespaces. python3: Debian's /usr/bin/python3, the
# interpreter run_code runs inside the sandbox (world-executable, outside the venv).
# gcc + libc6-dev: the sandbox's C init and launcher, compiled from the package's
# .c files at first use. libpq5: psycopg.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        bubblewrap python3 gcc libc6-dev libpq5 \
    && rm -rf /var/lib/apt/lists/*

COPY --from=wheel /wheels /wheels
RUN python -m venv /opt/venv \
    && pip install /wheels/*.whl \
    && rm -rf /wheels \
    && DEBUG=false SECRET_KEY=build-only python -m django collectstatic --noinput

# web and beat run as this user; the worker stays root (docker-compose.yml says why).
# The sandbox root must be traversable by uid 65534 (the sandbox's user).
RUN useradd --system --uid 10001 --home-dir /var/lib/controlplane --create-home app \
    && mkdir -p /var/lib/controlplane/sandbox /var/lib/controlplane/metrics \
    && chown app /var/lib/controlplane/metrics \
    && chmod 0711 /var/lib/controlplane /var/lib/controlplane/sandbox
WORKDIR /var/lib/controlplane
USER app

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "controlplane.asgi:application"]
