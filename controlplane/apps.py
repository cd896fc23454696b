from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Control plane"

    def ready(self) -> None:
        from controlplane import checks  # noqa: F401  (registers the system checks)
