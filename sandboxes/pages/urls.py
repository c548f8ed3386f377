"""Routes of the sandboxes app (namespace "sandboxes")."""

from django.urls import path

from ..network import pages as network
from ..terminal import views as terminal_views
from . import inbound, sessions, teardown, unmanaged

urlpatterns = [
    path("sandboxes/<uuid:config_id>/delete/", teardown.config_delete, name="config_delete"),
    path("sessions/", sessions.session_list, name="session_list"),
    path("spaces/<uuid:space_id>/sessions/new/", sessions.session_start, name="session_start"),
    path("sessions/<uuid:session_id>/", sessions.session_detail, name="session_detail"),
    path("sessions/<uuid:session_id>/stats/", sessions.session_stats, name="session_stats"),
    path("sessions/<uuid:session_id>/upload/", sessions.session_upload, name="session_upload"),
    path("sessions/<uuid:session_id>/download/", sessions.session_download, name="session_download"),
    path("sessions/<uuid:session_id>/collect/", sessions.session_collect, name="session_collect"),
    path(
        "sessions/<uuid:session_id>/artifacts/<uuid:artifact_id>/", sessions.artifact_download, name="artifact_download"
    ),
    path("sessions/<uuid:session_id>/actions/<str:action>/", sessions.session_action, name="session_action"),
    path("sessions/<uuid:session_id>/commands/", sessions.command_start, name="command_start"),
    path("sessions/<uuid:session_id>/inbound/link/", inbound.session_inbound_link, name="session_inbound_link"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>/", sessions.command_detail, name="command_detail"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>/kill/", sessions.command_kill, name="command_kill"),
    path("spaces/<uuid:space_id>/network/explain/", network.network_explain, name="network_explain"),
    path("spaces/<uuid:space_id>/egress/", network.egress_list, name="egress_list"),
    path(
        "spaces/<uuid:space_id>/egress/<uuid:event_id>/allow-space/",
        network.egress_allow_space,
        name="egress_allow_space",
    ),
    path(
        "spaces/<uuid:space_id>/egress/<uuid:event_id>/allow-session/",
        network.egress_allow_session,
        name="egress_allow_session",
    ),
    path("sessions/<uuid:session_id>/grants/<uuid:grant_id>/revoke/", network.grant_revoke, name="grant_revoke"),
]

# The platform's Backends section (platform admins only; sandboxes/pages/platform.py).
urlpatterns += [
    path("platform/unmanaged/", unmanaged.unmanaged_list, name="unmanaged_list"),
    path("platform/unmanaged/delete/", unmanaged.unmanaged_delete, name="unmanaged_delete"),
]

# The web terminal (sandboxes/terminal/views.py; docs/terminal-protocol.md).
urlpatterns += [
    path("sessions/<uuid:session_id>/terminal/", terminal_views.terminal_page, name="terminal_page"),
    path("sessions/<uuid:session_id>/terminals/", terminal_views.terminal_create, name="terminal_create"),
]
