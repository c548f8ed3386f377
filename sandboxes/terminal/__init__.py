"""The web terminal: tickets, access and the PTY owner (`tickets`), the websocket consumer
(`consumer`), its pages (`views`) and websocket routes (`routing`).

May import: `sandboxes.sessions`, `sandboxes.backends`, `sandboxes.models`, `console`.
Never `api` or `pages`.
"""
