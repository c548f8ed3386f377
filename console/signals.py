"""Signals the console app sends for other apps to act on (no app imports the others' internals).

`login_sessions_ended(sender, user_id)`: sent inside the transaction of
`do_logout_everywhere` after the user's login sessions were deleted; the terminals close the
user's shells once that transaction commits.

`network_policy_changed(sender, space, actor)`: sent once a changed network policy of `space`
is committed (`do_update_network_policy`); the sandboxes app applies it to the running
sandboxes whose backends take it live.

`process_released(sender, process_id, job_ids)`: sent inside the transaction that releases
a dead (or shutting-down) console process's work (console/processes.py), after its jobs
`job_ids` were marked failed; each app frees what that process held (exec slots, background
commands, skill image builds of those jobs) and returns what it released, in words.
"""

from django.dispatch import Signal

login_sessions_ended = Signal()
network_policy_changed = Signal()
process_released = Signal()
