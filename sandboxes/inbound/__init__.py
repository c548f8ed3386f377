"""Inbound traffic to sandbox ports through the console: the ASGI route (`proxy`: routing,
lookups, credentials), one HTTP exchange (`forward`), websockets (`websocket`) and what they
share (`common`), and the agent API's inbound routes (`api`). The page is in
`sandboxes/pages/inbound.py`, the session side in `sandboxes/sessions/inbound.py`.

May import: `sandboxes.sessions` (which sandbox serves a port), `sandboxes.catalog`,
`sandboxes.backends`, `sandboxes.models`, `console`; its `api` module also `sandboxes.api`
(auth, wire, errors) and `sandboxes.sessions.api`. Only `console.asgi` and the API's URLconf
import it; never `terminal` or `pages`.
"""
