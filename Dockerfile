# One image for web (daphne), worker (celery) and beat; configured by environment only.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# bubblewrap: the sandbox runner's namespaces; libpq for psycopg.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap libpq5 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml ./
COPY . .
RUN pip install . && DEBUG=false SECRET_KEY=build-only python manage.py collectstatic --noinput

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "controlplane.asgi:application"]
