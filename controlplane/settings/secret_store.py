"""The per-tenant secret store's encryption keys (controlplane.secret_keys)."""

from __future__ import annotations

from pathlib import Path

from controlplane.environment import env
from controlplane.settings.base import BASE_DIR

# Fernet keys (urlsafe base64 of 32 bytes), comma-separated: the first encrypts,
# every one decrypts. Rotation: put a new key first, keep the old ones, run
# `manage.py rotate_secret_keys`, then drop the old ones (docs/secrets.md).
SECRET_STORE_KEYS = env.items(
    "CONTROLPLANE_SECRET_KEYS",
    "",
    help="Comma-separated Fernet keys of the secret store (first encrypts, all "
    "decrypt); required when DEBUG is off. Empty with DEBUG on: a development key "
    "is generated once into SECRET_STORE_DEV_KEY_FILE.",
)
# With DEBUG on and no keys, the key `make run` generates (mode 0600) and every
# process of this checkout reads. It lives beside the embedded Redis and the test
# databases in .run/ (gitignored), and `make clean` removes it with db.sqlite3:
# the secrets it encrypts go with it.
SECRET_STORE_DEV_KEY_FILE = Path(BASE_DIR / ".run" / "secret-store.key")
