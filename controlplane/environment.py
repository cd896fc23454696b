"""Strict readers for settings taken from the environment.

A malformed value never raises at import time: it is recorded with the variable's
name and the default is used, and the `controlplane.E001` system check reports it,
so `migrate`, `check` and `manage.py dev` stop with a message that names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class EnvVariable:
    name: str
    default: str
    help: str


@dataclass
class EnvironmentReader:
    variables: dict[str, EnvVariable] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def _raw(self, name: str, default: str, help: str) -> str:
        self.variables[name] = EnvVariable(name, default, help)
        return os.environ.get(name, default)

    def string(self, name: str, default: str = "", *, help: str = "") -> str:
        return self._raw(name, default, help).strip()

    def boolean(self, name: str, default: bool, *, help: str = "") -> bool:
        raw = self._raw(name, "true" if default else "false", help).strip().lower()
        if raw in {"1", "true", "yes", "on"}:
            return True
        if raw in {"0", "false", "no", "off", ""}:
            return False
        self.problems.append((name, f"{raw!r} is not a boolean; use true or false"))
        return default

    def integer(
        self, name: str, default: int, *, minimum: int = 0, help: str = ""
    ) -> int:
        raw = self._raw(name, str(default), help).strip()
        try:
            value = int(raw)
        except ValueError:
            self.problems.append((name, f"{raw!r} is not an integer"))
            return default
        if value < minimum:
            self.problems.append((name, f"{value} is below the minimum {minimum}"))
            return default
        return value

    def number(
        self, name: str, default: float, *, minimum: float = 0.0, help: str = ""
    ) -> float:
        raw = self._raw(name, str(default), help).strip()
        try:
            value = float(raw)
        except ValueError:
            self.problems.append((name, f"{raw!r} is not a number"))
            return default
        if not (value >= minimum and value != float("inf")):
            self.problems.append((name, f"{raw!r} must be a finite number ≥ {minimum}"))
            return default
        return value

    def items(self, name: str, default: str, *, help: str = "") -> list[str]:
        raw = self._raw(name, default, help)
        return [item.strip() for item in raw.split(",") if item.strip()]


env = EnvironmentReader()
