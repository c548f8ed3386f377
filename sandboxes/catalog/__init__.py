"""What sandboxes are made of: configs, platform backends, templates and snapshots.

Holds the writes on sandbox configs and platform backends (`services`, `platform`), the
space-scoped template/snapshot catalog (`templates`), and the admin jobs that test, verify
and build against a config's backend (`jobs`, `verify`). `bridge.get_backend` is the one
bridge from a config row to a backend adapter (`bridge` also holds the metadata labels, the
ownership rules and the network spec a backend is sent). Its pages: `config_pages`,
`template_pages`, `platform_pages` (with `forms`, `by_kind`, `lookups`), `onboarding`, `urls`.

May import: `sandboxes.backends`, `sandboxes.models`, `console`. Never `sessions`, `network`,
`inbound`, `terminal` or `api` (they build on the catalog, not the other way round).
"""
