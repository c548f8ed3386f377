"""The agent API under /api/v1/: views (`views`), routes (`urls`) and its OpenAPI description.

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.backends`,
`sandboxes.models`, `console`. Never `terminal` or `pages`.
"""
