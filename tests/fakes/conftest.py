"""Fixtures of the fake servers' own tests: the Cube nodes' workspace storage, shared with the
sandbox tests (tests/sandboxes/conftest.py)."""

from tests.sandboxes.conftest import cube_host_root  # noqa: F401 - fixture
