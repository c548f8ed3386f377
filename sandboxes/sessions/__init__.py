"""Sessions and what runs in them: the session store, the runtime, the reaper, workspaces,
background commands and output streams, and their pages.

`runtime` is the one place that turns a session key into a live sandbox, on the adapters
(`catalog.bridge.get_backend`), templates and workspace layout of `provisioning`; `lookup`
finds or creates the session row; `store` / `store_db` hold bindings, lifecycle locks and
turn leases (Redis or SQL); `reaper` is the periodic housekeeping; `workspace` (+
`workspace_helper`, run inside the sandbox, never imported) the confined file access;
`commands` and `streams` background commands and their output. Its pages: `pages`
(sessions, files, commands), `teardown_pages`, `unmanaged_pages`, with `access` (a session
through the access check), `panels` (the cards other rooms add to the session page) and
`urls`; `api` the agent API's session routes.

May import: `sandboxes.backends`, `sandboxes.models`, `sandboxes.catalog`, `console`; its
`api` module also `sandboxes.api` (auth, wire format, errors). Never `network`, `inbound`,
`terminal` or `api` otherwise: their cards on the session page come by registration
(`panels`).
"""
