"""Listing sandboxes: their claims by label, a page at a time as the API pages them.

One `GET .../sandboxclaims?labelSelector=…&limit=…` (per-space mode: across namespaces,
`GET /apis/extensions.agents.x-k8s.io/v1beta1/sandboxclaims`, since a query names no
space or several, keeping only claims in the backend's own namespaces); the page token
handed out is the API's own `continue` token and goes back as `continue=`. The API keeps a
continue token a few minutes: an expired one answers 410 (`ResourceExpired`), which is
`gone` here, the listing to be started again. What labels
cannot say is checked on each item after the API answered: metadata values that were
hashed into a label (their exact text is in the claim's annotation) and the states asked
for (from each claim's forwarded Ready condition, `claims.claim_state`). A page may so hold
fewer items than the limit; the token still says whether more follow.

May import: the contract, `.client`, `.claims`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, ListQuery, Page, RemoteError
from . import claims
from .client import call

if TYPE_CHECKING:
    from .backend import KubernetesBackend

MAX_PAGE = 500


def list_page(backend: KubernetesBackend, query: ListQuery) -> Page:
    group, version, plural = claims.CLAIMS
    kwargs: dict[str, Any] = {
        "label_selector": claims.selector_for(query.metadata),
        "limit": max(1, min(query.limit, MAX_PAGE)),
        "_request_timeout": backend.request_timeout,
    }
    if query.page_token:
        kwargs["_continue"] = query.page_token
    try:
        if backend.per_space:
            answer = call(
                "listing sandboxes", backend.custom.list_cluster_custom_object, group, version, plural, **kwargs
            )
        else:
            answer = call(
                "listing sandboxes",
                backend.custom.list_namespaced_custom_object,
                group,
                version,
                backend.base_namespace,
                plural,
                **kwargs,
            )
    except RemoteError as exc:
        if exc.kind == ErrorKind.GONE and query.page_token:
            raise RemoteError(
                ErrorKind.GONE, f"the listing's page token expired; list again from the start ({exc.message})"
            ) from None
        raise
    items = []
    for claim in answer.get("items") or []:
        if not backend.holds(claim):
            continue  # per space the listing spans the cluster: another team's look-alike is not ours
        info = claims.info_of(claim, claims.claim_state(claim))
        if any(info.metadata.get(k) != v for k, v in query.metadata.items()):
            continue
        if query.states and info.state not in query.states:
            continue
        items.append(info)
    token = (answer.get("metadata") or {}).get("continue") or None
    return Page(items=tuple(items), next_token=token)
