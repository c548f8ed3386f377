"""Inbound traffic to sandbox ports through the console, all of it: the session side
(`links`: a port's URL, signed links, what the route may reach; `hosts`: a host per sandbox
port under a wildcard `INBOUND_BASE_URL`), the ASGI route (`proxy`: routing, lookups,
credentials), one HTTP exchange (`forward`), websockets (`websocket`) and what they share
(`common`), and the session page's Inbound card (`pages`, `urls`). The API's part is
`sandboxes/api/inbound.py`; a backend's, its `inbound` capability.

May import: `sandboxes.sessions` (which sandbox serves a port), `sandboxes.catalog`,
`sandboxes.backends`, `sandboxes.models`, `console`. `console.asgi`, the API and the app's
URLconf import it; never `network` or `terminal`.
"""
