"""Sessions and what runs in them: the session store, the runtime, the reaper, workspaces,
background commands and output streams.

`runtime` is the one place that turns a session key into a live sandbox, on the adapters,
templates and workspace layout of `provisioning`; `lookup` finds or creates the session
row; `store` /
`store_db` hold bindings, lifecycle locks and turn leases (Redis or SQL); `reaper` is the
periodic housekeeping; `workspace` (+ `workspace_helper`, run inside the sandbox, never
imported) the confined file access; `commands` and `streams` background commands and their
output; `api` the agent API's session routes.

May import: `sandboxes.backends`, `sandboxes.models`, `sandboxes.catalog`, `console`; its
`api` module also `sandboxes.api` (auth, wire format, errors). Never `terminal` or `pages`.
"""
