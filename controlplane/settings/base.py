"""The project: secrets, hosts, apps, middleware, sign-in, static files, the API.

Also the registries later modules add to: demo seeders and metric collectors.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path

import django_stubs_ext

from controlplane.environment import env

# Lets `ModelAdmin[Model]` and friends be subscripted at run time, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent

INSECURE_DEV_SECRET_KEY = "django-insecure-dev-only-do-not-use-in-production"

SECRET_KEY = (
    env.string(
        "SECRET_KEY",
        INSECURE_DEV_SECRET_KEY,
        help="Django secret key; must be set (and DEBUG false) in production.",
    )
    or INSECURE_DEV_SECRET_KEY
)
DEBUG = env.boolean(
    "DEBUG", True, help="Debug pages and the dev secret key; off in prod."
)
ALLOWED_HOSTS = env.items(
    "ALLOWED_HOSTS",
    "localhost,127.0.0.1,[::1],testserver",
    help="Comma-separated host names the web server answers to.",
)
CSRF_TRUSTED_ORIGINS = env.items(
    "CSRF_TRUSTED_ORIGINS",
    "",
    help="Comma-separated origins (https://host) trusted for POSTs behind a proxy.",
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "axes",
    "csp",
    "controlplane",
    "budgets",
    "runs",
    "shop",
    "approvals",
    "tracing",
    "frontend",
]

MIDDLEWARE = [
    # First: it turns every error on /api/ and /v1/ into JSON, Django's own pages
    # (the DEBUG ones included) and other middleware's refusals too.
    "controlplane.api_errors.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login refused by the lockout into its 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# django-axes watches every login (the site's and the admin's) before the model
# backend checks the password.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # ModelBackend, refusing accounts whose every membership is deactivated.
    "controlplane.authentication.MemberModelBackend",
]
AUTH_LOGIN_FAILURE_LIMIT = env.integer(
    "AUTH_LOGIN_FAILURE_LIMIT",
    10,
    minimum=1,
    help="Failed logins per username, and per address, before logins are refused "
    "(429) for AUTH_LOCKOUT_MINUTES.",
)
AUTH_TOKEN_FAILURE_LIMIT = env.integer(
    "AUTH_TOKEN_FAILURE_LIMIT",
    20,
    minimum=1,
    help="Refused bearer tokens per address, and per account, before every token "
    "from there is refused (429) for AUTH_LOCKOUT_MINUTES.",
)
AUTH_LOCKOUT_MINUTES = env.number(
    "AUTH_LOCKOUT_MINUTES",
    15.0,
    minimum=0.1,
    help="How long failures are counted and a lockout lasts, in minutes.",
)
PASSWORD_LINK_HOURS = env.number(
    "PASSWORD_LINK_HOURS",
    72.0,
    minimum=0.1,
    help="How long a one-time password link (an invitation) stays valid, in hours.",
)
PASSWORD_LINK_EMAIL_FROM = env.string(
    "PASSWORD_LINK_EMAIL_FROM",
    "",
    help="Sender address for emailing password links through Django's EMAIL_* "
    "settings; empty: links are not emailed, the admin passes them on.",
)
AXES_FAILURE_LIMIT = AUTH_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=AUTH_LOCKOUT_MINUTES)
# Either one locks: a password sprayed from many addresses at one account, or
# many accounts tried from one address.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlplane.authentication.login_lockout_response"
AXES_DISABLE_ACCESS_LOG = True  # successful logins need no row of their own
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(
    env.string(
        "STATIC_ROOT",
        str(BASE_DIR / "staticfiles"),
        help="Where collectstatic puts the static files (the image sets it).",
    )
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True
if DEBUG:
    # In development static files come from the finders; no collectstatic needed.
    warnings.filterwarnings("ignore", message="No directory at")

# Django refuses larger bodies when `request.body` is read (DRF reads JSON through
# it); the API answers 413 (controlplane.api_errors). OTLP ingest has its own cap.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.integer(
    "API_MAX_BODY_BYTES",
    2_621_440,
    minimum=1024,
    help="Largest request body the API and the pages accept (larger: 413).",
)

REST_FRAMEWORK = {
    # The API speaks JSON only, parsed with bounded nesting and no NUL characters.
    "DEFAULT_PARSER_CLASSES": ["controlplane.api_input.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.permissions.MayAct"],
    "DEFAULT_SCHEMA_CLASS": "controlplane.api_schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api_errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "controlplane.api_input.BoundedPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent control plane API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api_schema.otlp_paths",
    ],
}

DEMO_PASSWORD = env.string(
    "DEMO_PASSWORD",
    "",
    help="Password of the demo users; generated and printed once when empty.",
)
PORT = env.integer("PORT", 8000, minimum=1, help="Port `manage.py dev` serves on.")

# Pages run only the ES modules served from here: no inline script, no eval, no
# other origin. Style attributes stay allowed: the trace tree positions its
# virtualised rows with them, and an attribute cannot run script.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "style-src-attr": ["'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# Read (and so declared) in every mode; applied only with DEBUG off. compose serves
# plain HTTP and sets it false; behind a TLS proxy keep it true.
_SECURE_COOKIES = env.boolean(
    "SECURE_COOKIES", True, help="Send cookies over HTTPS only (when DEBUG off)."
)
if not DEBUG:
    SESSION_COOKIE_SECURE = _SECURE_COOKIES
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# Each app that owns demo data adds its seeder; `seed_demo` calls them in order.
DEMO_SEEDERS: list[str] = []
# Seeders that define demo data through the API (`seed_demo --with-mcp`, and
# `make run` once its server answers): f(*, tenant, model_url, api_url).
DEMO_API_SEEDERS: list[str] = []
# Each app that reports gauges read at scrape time (GET /metrics) adds a function
# returning prometheus-client metric families (controlplane.metrics).
METRICS_COLLECTORS: list[str] = []
