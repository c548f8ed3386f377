"""The RBAC manifest docs/kubernetes.md gives platform admins, as the tests read it: its YAML
blocks, the Role the console's ServiceAccount is bound to, and the rule one namespace per space
adds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.S | re.M)


def manifest_documents() -> list[dict[str, Any]]:
    documents = [doc for block in yaml_blocks() for doc in yaml.safe_load_all(block)]
    return [doc for doc in documents if isinstance(doc, dict)]


def manifest(kind: str) -> dict[str, Any]:
    """The one document of `kind` in the manifest."""
    [found] = [doc for doc in manifest_documents() if doc.get("kind") == kind]
    return found


def console_role() -> dict[str, Any]:
    return manifest("Role")


def namespaces_rule() -> list[dict[str, Any]]:
    """The rule docs/kubernetes.md adds for one namespace per space (a bare list item)."""
    [rules] = [yaml.safe_load(block) for block in yaml_blocks() if block.lstrip().startswith("- ")]
    return list(rules)
