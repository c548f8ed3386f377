"""Warm pools: sandboxes a config keeps ready, so a new session's first resolve takes one
instead of waiting for a create (docs/operations.md, "Warm pools").

`keeper` makes and drains them (`refill`, the periodic `refill_all`, `kick` after a claim or a
change); `claim` hands one to a session (`take`, registered with `sessions.provisioning` as a
warm source, so the runtime never imports this room); `stats` counts them for the Pools pages
and `gauges` for /metrics; `services` holds `do_set_pool_size`; `pages` and `urls` the Pools
pages. A backend that keeps pools itself (`Backend.warm_pools()`) is asked instead.

May import: `sandboxes.backends`, `sandboxes.models`, `sandboxes.catalog`, `sandboxes.sessions`
and `console`.
"""
