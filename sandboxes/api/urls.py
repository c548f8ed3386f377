"""Routes of the agent API (namespace "api"), mounted at /api/v1/."""

from django.urls import path

from ..network import api as api_network
from . import inbound as api_inbound
from . import views as api

app_name = "api"

SESSION_ROOT = "spaces/<uuid:space_id>/sessions/<str:key>"
SESSION = SESSION_ROOT + "/"

urlpatterns = [
    path("openapi.json", api.openapi_view, name="openapi"),
    path("spaces/<uuid:space_id>/network/explain", api_network.explain_view, name="network_explain"),
    # As described (no trailing slash), and with one: APPEND_SLASH would answer a DELETE
    # without it with a redirect that clients do not follow.
    path(SESSION_ROOT, api.session_view, name="session"),
    path(SESSION, api.session_view),
    path(SESSION + "resolve", api.resolve_view, name="resolve"),
    path(SESSION + "pause", api.pause_view, name="pause"),
    path(SESSION + "turns/begin", api.turn_begin_view, name="turn_begin"),
    path(SESSION + "turns/end", api.turn_end_view, name="turn_end"),
    path(SESSION + "exec", api.exec_view, name="exec"),
    path(SESSION + "input/<path:path>", api.input_upload_view, name="input_upload"),
    path(SESSION + "files", api.files_view, name="files"),
    path(SESSION + "files/content", api.file_content_view, name="file_content"),
    path(SESSION + "artifacts", api.artifact_list_view, name="artifacts"),
    path(SESSION + "artifacts/collect", api.collect_view, name="collect"),
    path(SESSION + "artifacts/<uuid:artifact_id>", api.artifact_download_view, name="artifact_download"),
    path(SESSION + "commands", api.commands_view, name="commands"),
    path(SESSION + "commands/<uuid:command_id>/output", api.command_output_view, name="command_output"),
    path(SESSION + "commands/<uuid:command_id>/stdin", api.command_stdin_view, name="command_stdin"),
    path(SESSION + "commands/<uuid:command_id>/kill", api.command_kill_view, name="command_kill"),
    path(SESSION + "inbound", api_inbound.inbound_view, name="inbound"),
    path(SESSION + "inbound/links", api_inbound.inbound_link_view, name="inbound_links"),
]
