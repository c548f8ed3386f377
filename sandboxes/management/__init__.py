"""Management commands of the sandboxes app (`commands/`): entry points like the Celery tasks.

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.backends`, `sandboxes.models`,
`console`. Never `api`, `terminal` or `pages`.
"""
