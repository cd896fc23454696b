"""Re-encrypt every tenant secret with the first key of CONTROLPLANE_SECRET_KEYS."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from controlplane.secrets import SecretKeysUnavailable, secret_keys_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every tenant secret with the first key of "
        "CONTROLPLANE_SECRET_KEYS. Rotation: put the new key first and keep the "
        "old ones, run this, then remove the old keys (docs/secrets.md)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rotated, unreadable = secret_keys_rotate()
        except SecretKeysUnavailable as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Re-encrypted {rotated} secret(s) with the first key.")
        if unreadable:
            names = ", ".join(f"{s.tenant.slug}/{s.name}" for s in unreadable)
            # Nonzero exit: removing the old keys now would lose these for good.
            raise CommandError(
                f"{len(unreadable)} secret(s) no configured key decrypts: {names}. "
                "Add the key they were stored with back to CONTROLPLANE_SECRET_KEYS "
                "and run this again, or set them again."
            )
