from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"

    def ready(self) -> None:
        # Registers the system checks, and the schema's bearer token scheme.
        from controlplane import api_schema, checks  # noqa: F401
