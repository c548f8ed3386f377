"""Inbound traffic to sandbox ports through the console: the ASGI route (`proxy`: routing,
lookups, credentials), one HTTP exchange (`forward`), websockets (`websocket`) and what they
share (`common`). The page and API parts are in `sandboxes/pages/inbound.py` and
`sandboxes/api/inbound.py`, the session side in `sandboxes/sessions/inbound.py`.

May import: `sandboxes.sessions` (which sandbox serves a port), `sandboxes.catalog`,
`sandboxes.backends`, `sandboxes.models`, `console`. Only `console.asgi` imports it; never
`api`, `terminal` or `pages`.
"""
