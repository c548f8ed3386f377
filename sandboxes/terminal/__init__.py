"""The web terminal: `tickets` (a terminal's row, its single-use ticket, the handshake),
`access` (who may keep one open, and the signals that close or re-check them), `shells`
(opening a terminal's shell, ending a kept one, the audit of open and close), `process` (the
PTY owner) with `attachments` and `keeper`, the websocket `consumer`, its `pages`, `urls`,
websocket `routing`, wire constants (`protocol`) and the idle `sweep`.

May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.backends`, `sandboxes.models`,
`console`. Never `api`, `network` or `inbound`.
"""
