"""Routes of the session pages, their teardown and the platform's unmanaged resources
(namespace "sandboxes", joined in `sandboxes.urls`)."""

from django.urls import path

from . import bulk_pages as bulk
from . import file_pages as files
from . import pages as sessions
from . import teardown_pages as teardown
from . import unmanaged_pages as unmanaged

urlpatterns = [
    path("sandboxes/<uuid:config_id>/delete/", teardown.config_delete, name="config_delete"),
    path("sessions/", sessions.session_list, name="session_list"),
    path("sessions/actions/", bulk.session_bulk, name="session_bulk"),
    path("sessions/usage/", bulk.session_usage, name="session_usage"),
    path("spaces/<uuid:space_id>/sessions/new/", sessions.session_start, name="session_start"),
    path("sessions/<uuid:session_id>/", sessions.session_detail, name="session_detail"),
    path("sessions/<uuid:session_id>/stats/", sessions.session_stats, name="session_stats"),
    path("sessions/<uuid:session_id>/logs/", sessions.session_logs, name="session_logs"),
    path("sessions/<uuid:session_id>/upload/", sessions.session_upload, name="session_upload"),
    path("sessions/<uuid:session_id>/download/", sessions.session_download, name="session_download"),
    path("sessions/<uuid:session_id>/files/view/", files.file_preview, name="file_preview"),
    path("sessions/<uuid:session_id>/files/raw/", files.file_raw, name="file_raw"),
    path("sessions/<uuid:session_id>/files/upload/", files.file_upload, name="file_upload"),
    path("sessions/<uuid:session_id>/files/mkdir/", files.file_mkdir, name="file_mkdir"),
    path("sessions/<uuid:session_id>/files/rename/", files.file_rename, name="file_rename"),
    path("sessions/<uuid:session_id>/files/delete/", files.file_delete, name="file_delete"),
    path("sessions/<uuid:session_id>/collect/", sessions.session_collect, name="session_collect"),
    path(
        "sessions/<uuid:session_id>/artifacts/<uuid:artifact_id>/", sessions.artifact_download, name="artifact_download"
    ),
    path("sessions/<uuid:session_id>/labels/", sessions.session_labels, name="session_labels"),
    path("sessions/<uuid:session_id>/keep-awake/", sessions.session_keep_awake, name="session_keep_awake"),
    path("sessions/<uuid:session_id>/actions/<str:action>/", sessions.session_action, name="session_action"),
    path("sessions/<uuid:session_id>/commands/", sessions.command_start, name="command_start"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>/", sessions.command_detail, name="command_detail"),
    path("sessions/<uuid:session_id>/commands/<uuid:command_id>/kill/", sessions.command_kill, name="command_kill"),
    # The platform's unmanaged resources (platform admins only).
    path("platform/unmanaged/", unmanaged.unmanaged_list, name="unmanaged_list"),
    path("platform/unmanaged/delete/", unmanaged.unmanaged_delete, name="unmanaged_delete"),
]
