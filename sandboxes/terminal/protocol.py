"""The terminal's wire constants (docs/terminal-protocol.md): the close codes after accept,
the refusals before it, and the sizes of what flows between the PTY and the websocket."""

READ_BYTES = 64 * 1024
QUEUE_CHUNKS = 32  # reader -> sender; at most QUEUE_CHUNKS * READ_BYTES in flight
MAX_PENDING_INPUT = 64 * 1024  # typed before the shell started
# Input waiting for a shell that does not read it (a 10 MiB paste fits); more is dropped.
MAX_QUEUED_INPUT = 16 * 1024 * 1024

# Close codes after accept (before accept a refusal is a 403 on the handshake).
CLOSE_NORMAL = 1000
CLOSE_IDLE = 4000
CLOSE_LOGGED_OUT = 4001
CLOSE_ACCESS = 4003
CLOSE_SESSION_DELETED = 4004  # the shell ended because its session (and sandbox) was deleted
CLOSE_REPLACED = 4009
CLOSE_UNAVAILABLE = 4010
CLOSE_SERVER_STOPPING = 4012  # (1001 is the server's own: Autobahn refuses it from the app)
# Refusals before accept (seen by test clients; browsers see 1006).
REFUSE_TICKET = 4401
REFUSE_FORBIDDEN = 4403
REFUSE_NOT_FOUND = 4404
