"""Routes of the sandboxes app's pages (namespace "sandboxes"): each room's `urls.py`, joined.

The agent API has its own URLconf (`sandboxes.api.urls`, under /api/v1/); the space's policy
page is routed by the console's (`console:network_policy_edit`)."""

from django.urls import path

from .api import pages as tokens
from .catalog import urls as catalog
from .pages import urls as pages

app_name = "sandboxes"

urlpatterns = [
    *catalog.urlpatterns,
    *pages.urlpatterns,
    # API tokens of a space: the page beside the tokens it writes (`sandboxes.api.tokens`).
    path("spaces/<uuid:space_id>/tokens/", tokens.token_list, name="token_list"),
    path("spaces/<uuid:space_id>/tokens/<uuid:token_id>/revoke/", tokens.token_revoke, name="token_revoke"),
]
