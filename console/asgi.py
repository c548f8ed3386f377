"""ASGI entry point served by Daphne: HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.dev")
# Django must be set up before anything that touches models is imported.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from sandboxes.catalog.warm_up import warm_up  # noqa: E402
from sandboxes.inbound.proxy import InboundRouter  # noqa: E402

from .processes import start_up  # noqa: E402
from .routing import websocket_urlpatterns  # noqa: E402
from .scheduler import start_in_process_scheduler  # noqa: E402
from .security import OriginValidator  # noqa: E402

# The embedded console serves its own static files; a deployment behind a web server
# sets the knob serving.static=false and lets the server do it.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app

# This process owns exec slots, commands and jobs: registered with a heartbeat, and what
# dead processes held (a crash before this start) is released now (console/processes.py).
start_up("web")
# The first resolve after a start finds its backend adapters imported and their engine
# connections open (sandboxes/catalog/warm_up.py).
warm_up()
# The embedded console runs its periodic tasks (reaper, idle sweep) in this process.
start_in_process_scheduler()

application = ProtocolTypeRouter(
    {
        # /inbound/<sandbox>/<port>/… goes to that sandbox port (sandboxes/inbound/proxy.py).
        "http": InboundRouter(http_app),
        # Scheme, host and port of the Origin are checked (console/security.py).
        # /inbound/… websockets go to the sandbox port; the console's own are checked here.
        "websocket": InboundRouter(OriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
)
