"""The Celery application (used when REDIS_URL is set).

Every task message carries the request id of the code that sent it (a `request_id` header),
and the worker runs the task under it (a new one for beat's periodic tasks), so a job's log
lines share the id of the API call or page that started it (console/logs.py). Celery keeps
the console's logging set-up (settings: CELERY_WORKER_HIJACK_ROOT_LOGGER) rather than its own.
"""

import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.dev")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

REQUEST_ID_HEADER = "request_id"


@app.on_after_finalize.connect
def _beat_schedule(sender: Celery, **_: Any) -> None:
    """Beat's schedule, built from the tasks registered beside their functions
    (console/periodic.py). The app is finalized once Django is set up and the apps' task
    modules are imported (`celery beat` does both before it reads the schedule)."""
    from django.apps import apps

    if apps.ready:
        from .periodic import beat_schedule

        sender.conf.beat_schedule = beat_schedule()


@signals.setup_logging.connect
def _keep_django_logging(**_: Any) -> None:
    """Connected, so Celery configures no logging of its own: Django's LOGGING stands."""


@signals.before_task_publish.connect
def _send_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    from .logs import get_request_id

    rid = get_request_id()
    if headers is not None and rid and REQUEST_ID_HEADER not in headers:
        headers[REQUEST_ID_HEADER] = rid


@signals.task_prerun.connect
def _take_request_id(task: Any = None, **_: Any) -> None:
    from .logs import new_request_id, sane_request_id, set_request_id

    given = getattr(task.request, REQUEST_ID_HEADER, None) if task is not None else None
    set_request_id(sane_request_id(given) if given else new_request_id())


@signals.task_postrun.connect
def _drop_request_id(**_: Any) -> None:
    from .logs import set_request_id

    set_request_id("")


@signals.worker_process_shutdown.connect
def _metrics_process_dead(**_: Any) -> None:
    from .metrics import MULTIPROCESS, mark_this_process_dead

    if MULTIPROCESS:
        mark_this_process_dead()


@signals.worker_ready.connect
def _register_worker(**_: Any) -> None:
    """The worker owns the jobs it runs: registered with a heartbeat, and what dead processes
    held is released at its start (console/processes.py)."""
    from .processes import start_up

    start_up("worker")


@signals.worker_shutdown.connect
def _release_worker(**_: Any) -> None:
    """After a warm shutdown nothing runs any more; anything left is released now."""
    from .processes import registered_process, release_this_process

    if registered_process() is not None:
        release_this_process()
