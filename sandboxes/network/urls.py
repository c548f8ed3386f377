"""Routes of the network pages (namespace "sandboxes", joined in `sandboxes.urls`); the policy
page itself is routed by the console's URLconf (`console:network_policy_edit`)."""

from django.urls import path

from . import pages

urlpatterns = [
    path("spaces/<uuid:space_id>/network/explain/", pages.network_explain, name="network_explain"),
    path("spaces/<uuid:space_id>/egress/", pages.egress_list, name="egress_list"),
    path(
        "spaces/<uuid:space_id>/egress/<uuid:event_id>/allow-space/",
        pages.egress_allow_space,
        name="egress_allow_space",
    ),
    path(
        "spaces/<uuid:space_id>/egress/<uuid:event_id>/allow-session/",
        pages.egress_allow_session,
        name="egress_allow_session",
    ),
    path("sessions/<uuid:session_id>/grants/<uuid:grant_id>/revoke/", pages.grant_revoke, name="grant_revoke"),
]
