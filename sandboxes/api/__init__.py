"""The agent API under /api/v1/: views (`views`, `inbound`, `network`), the wire format
(`wire`: bodies, parameters, error answers), cursor pages (`pagination`), routes (`urls`)
and its OpenAPI description (`openapi`).

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.egress`, `sandboxes.backends`,
`sandboxes.models`, `console`. Never `terminal` or `pages`.
"""
