"""The apps import one way (tests/layers.py holds the order and the scanner).

docs/architecture.md draws the layers and says why controlplane's composition root
may import any app.
"""

from __future__ import annotations

from pathlib import Path

from tests.layers import (
    ORDER,
    apps_on_disk,
    imports_of,
    layer_violations,
)


def test_every_app_has_a_place_in_the_order() -> None:
    assert apps_on_disk() <= set(ORDER), "add the new app to tests/layers.py ORDER"


def test_no_app_imports_upward_and_no_import_dodges_a_cycle() -> None:
    found = layer_violations()
    assert not found, "layer violations:\n" + "\n".join(
        place for places in found.values() for place in places
    )


def test_the_scanner_sees_upward_local_and_relative_imports(tmp_path: Path) -> None:
    for package in ("controlplane", "runs", "runs/services", "approvals"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "runs/models.py").write_text("")
    (tmp_path / "approvals/models.py").write_text("from runs import models\n")
    (tmp_path / "approvals/services.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import models\n"
        "from controlplane.permissions import can\n"
        "if TYPE_CHECKING:\n"
        "    from runs.models import Run\n"
        "def decide():\n"
        "    from controlplane import audit\n"
    )
    (tmp_path / "runs/services/advance.py").write_text(
        "from ..models import Run\nimport approvals.models\n"
    )
    (tmp_path / "controlplane/urls.py").write_text(
        "import runs.views\ndef f():\n    import approvals.models\n"
    )
    (tmp_path / "controlplane/big.py").write_text("x = 1\n" * 451)

    services = imports_of(tmp_path / "approvals/services.py", tmp_path)
    assert [(i.module, i.local) for i in services] == [
        ("typing", False),
        ("approvals.models", False),
        ("controlplane.permissions", False),
        ("runs.models", False),
        ("controlplane", True),
    ]
    assert sorted(layer_violations(tmp_path)) == [
        "approvals/models.py -> runs.models",
        "approvals/services.py -> controlplane",
        "approvals/services.py -> runs.models",
        "controlplane/big.py -> over 450 lines",
        "controlplane/urls.py -> approvals.models",
    ]
