"""Routes of the sandboxes app's pages (namespace "sandboxes"): each room's `urls.py`, joined.

The agent API has its own URLconf (`sandboxes.api.urls`, under /api/v1/); the space's policy
page is routed by the console's (`console:network_policy_edit`)."""

from django.urls import path

from .api import pages as tokens
from .catalog import urls as catalog
from .inbound import urls as inbound
from .network import urls as network
from .pools import urls as pools
from .sessions import urls as sessions
from .terminal import urls as terminal

app_name = "sandboxes"

urlpatterns = [
    *catalog.urlpatterns,
    *sessions.urlpatterns,
    *inbound.urlpatterns,
    *network.urlpatterns,
    *pools.urlpatterns,
    *terminal.urlpatterns,
    # A space's API tokens: the page beside the tokens it writes (`sandboxes.api.tokens`).
    path("spaces/<uuid:space_id>/tokens/", tokens.token_list, name="token_list"),
    path("spaces/<uuid:space_id>/tokens/<uuid:token_id>/revoke/", tokens.token_revoke, name="token_revoke"),
]
