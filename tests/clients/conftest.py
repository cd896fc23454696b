"""The live Daphne of the browser tests, for the client package's tests."""

from tests.frontend.conftest import (  # noqa: F401 (fixtures)
    chromium,
    daphne,
    open_page,
)
