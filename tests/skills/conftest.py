"""The skills tests use the shared personas, the sandbox tests' Docker fixtures, the
install tests' fixtures (tests/support/skill_install.py) and the template with Node.js and npm."""

from tests.personas import World, world
from tests.sandboxes.conftest import docker_base_image, test_run_id
from tests.support.npm_source import docker_node_image
from tests.support.skill_install import apt_folder, examples_source, installation, runtime, wheels

__all__ = [
    "World",
    "apt_folder",
    "docker_base_image",
    "docker_node_image",
    "examples_source",
    "installation",
    "runtime",
    "test_run_id",
    "wheels",
    "world",
]
