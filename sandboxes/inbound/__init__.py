"""Inbound traffic to sandbox ports through the console, all of it: the session side
(`links`: a port's URL, signed links, what the route may reach; `hosts`: a host per sandbox
port under a wildcard `INBOUND_BASE_URL`), the ASGI route (`proxy`: routing, lookups,
credentials), one HTTP exchange (`forward`), websockets (`websocket`) and what they share
(`common`), the session page's Inbound card (`pages`, `urls`) and the agent API's inbound
routes (`api`). A backend's part is its `inbound` capability.

May import: `sandboxes.sessions` (which sandbox serves a port), `sandboxes.catalog`,
`sandboxes.backends`, `sandboxes.models`, `console`; its `api` module also `sandboxes.api`
(auth, wire, errors) and `sandboxes.sessions.api`. `console.asgi`, the API's and the app's
URLconfs import it; never `network` or `terminal`.
"""
