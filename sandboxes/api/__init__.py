"""The agent API's own part under /api/v1/: authentication (`auth`, and the token services
in `tokens`), the wire format (`wire`, cursor pages in `pagination`), the error mapping
(`errors`: one table from the services' exceptions to answers) and the NinjaAPI that mounts
the rooms' routes (`urls`: `sandboxes.sessions.api`, `sandboxes.inbound.api`,
`sandboxes.network.api`) and serves the OpenAPI description generated from them.

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.backends`,
`sandboxes.models`, `console`; `urls` also the rooms' `api` modules. Never `terminal` or
`pages`; no room but through its `api` module imports it.
"""
