"""pytest's view of the test package: the shared helpers live in tests/helpers.py and are
imported as `from tests.helpers import ...`; fixtures shared by several files live here."""

import pytest

from tests.helpers import tiny_checkpoints


@pytest.fixture(scope="session")
def tiny():
    """The tiny checkpoints' paths (target, eagle3-yuhuili, eagle3-speculators)."""
    return tiny_checkpoints()
