"""The agent API under /api/v1/: views (`views`, `inbound`; the network routes live in
`sandboxes.network.api`), the wire format (`wire`: bodies, parameters, error answers),
cursor pages (`pagination`), routes (`urls`) and its OpenAPI description (`openapi`).

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.network`, `sandboxes.backends`,
`sandboxes.models`, `console`. Never `terminal` or `pages`.
"""
