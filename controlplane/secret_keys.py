"""The secret store's keys: which Fernet keys encrypt and decrypt, and from where.

`CONTROLPLANE_SECRET_KEYS` lists them, comma-separated: the first encrypts, every
one decrypts (a `MultiFernet`), so a key is rotated by putting a new one first,
running `manage.py rotate_secret_keys` and then dropping the old one. With no
keys and DEBUG on (`make run`), a development key is generated once into
`SECRET_STORE_DEV_KEY_FILE` (mode 0600) and every process of the checkout reads
it; with DEBUG off no key is ever generated: the system check refuses to start.

A key never appears in a message: problems name the variable and the key's
position, and a stored secret records only its key's fingerprint (`key_id`).
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import logging
import os
import uuid
from pathlib import Path

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

HINT = (
    "Set CONTROLPLANE_SECRET_KEYS to one or more comma-separated Fernet keys, "
    "e.g. `python -c 'from cryptography.fernet import Fernet; "
    "print(Fernet.generate_key().decode())'` (docs/secrets.md)."
)


class SecretKeysUnavailable(ImproperlyConfigured):
    """The store has no usable key; the message says what is wrong, HINT what to set."""


def _is_fernet_key(key: str) -> bool:
    try:
        Fernet(key)
    except (ValueError, binascii.Error):
        return False
    return True


def key_id(key: str) -> str:
    """A key's fingerprint: tells keys apart, reveals nothing of a 256-bit key."""
    return hashlib.sha256(b"controlplane-secret-key:" + key.encode()).hexdigest()[:16]


def key_problems() -> list[str]:
    """What is wrong with the configured keys (empty: nothing); the system check
    reports these, and the store raises them instead of using a bad key."""
    keys: list[str] = list(settings.SECRET_STORE_KEYS)
    if keys:
        return [
            f"key {position} of {len(keys)} in CONTROLPLANE_SECRET_KEYS is not a "
            "Fernet key (32 bytes, url-safe base64-encoded)"
            for position, key in enumerate(keys, 1)
            if not _is_fernet_key(key)
        ]
    if not settings.DEBUG:
        return [
            "CONTROLPLANE_SECRET_KEYS is empty and DEBUG is off: the secret store "
            "has no key (a development key is generated only with DEBUG on)"
        ]
    path = Path(settings.SECRET_STORE_DEV_KEY_FILE)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return []  # generated at first use
    except OSError as exc:
        return [f"the development key file {path} cannot be read: {exc.strerror}"]
    if not _is_fernet_key(text):
        return [f"the development key file {path} does not hold a Fernet key"]
    return []


def dev_key_file_warnings() -> list[str]:
    """A development key file others than its owner may read."""
    path = Path(settings.SECRET_STORE_DEV_KEY_FILE)
    if settings.SECRET_STORE_KEYS or not path.exists():
        return []
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return [f"the development key file {path} has mode {mode:o}, not 600"]
    return []


def active_keys() -> tuple[str, ...]:
    """The keys in use, the encrypting one first; SecretKeysUnavailable if none is
    usable (never a half-configured store that encrypts with a bad key)."""
    problems = key_problems()
    if problems:
        raise SecretKeysUnavailable("; ".join(problems) + ". " + HINT)
    if settings.SECRET_STORE_KEYS:
        return tuple(settings.SECRET_STORE_KEYS)
    return (_dev_key(Path(settings.SECRET_STORE_DEV_KEY_FILE)),)


def fernet() -> MultiFernet:
    return _multi_fernet(active_keys())


@functools.lru_cache(maxsize=8)
def _multi_fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def _dev_key(path: Path) -> str:
    """The development key in `path`, generated there first if there is none.

    Web, worker and beat may all ask at once: each writes a candidate file of
    its own (0600 from the start) and links it into place; the first link wins
    and everyone reads the winner."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(Fernet.generate_key().decode() + "\n")
    try:
        os.link(candidate, path)
    except FileExistsError:
        pass  # another process generated it first
    else:
        logger.warning(
            "Secret store: CONTROLPLANE_SECRET_KEYS is empty, so a development key "
            "was generated into %s (mode 0600). The secrets stored with it are "
            "readable only while that file exists; set CONTROLPLANE_SECRET_KEYS "
            "in production (docs/secrets.md).",
            path,
        )
    finally:
        candidate.unlink()
    return path.read_text().strip()
