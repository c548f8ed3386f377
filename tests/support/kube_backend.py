"""A platform backend of kind kubernetes on the fake cluster (tests/fakes/kube/), granted to
spaces: the API server's URL, the admin token and the fake's CA, private endpoints allowed
(the fake listens on loopback), sandboxes in the `default` namespace."""

from __future__ import annotations

from typing import Any

from console.crypto import encrypt
from console.models import Space
from tests.factories import make_backend
from tests.fakes.kube.cluster import FakeCluster


def make_kube_backend(cluster: FakeCluster, *spaces: Space, **extra: Any) -> Any:
    """`extra`: more platform backend fields (`registry_url`, `max_pool_size`, ...)."""
    return make_backend(
        *spaces,
        kind="kubernetes",
        endpoint=cluster.url,
        api_key=cluster.admin_token,
        tls_ca_encrypted=encrypt(cluster.ca_pem),
        allow_private_endpoints=True,
        namespace="default",
        **extra,
    )
