"""Signals the console app sends for other apps to act on (no app imports the others' internals).

`login_sessions_ended(sender, user_id)`: sent inside the transaction of
`do_logout_everywhere` after the user's login sessions were deleted; the terminals close the
user's shells once that transaction commits.

`network_policy_changed(sender, space, actor)`: sent once a changed network policy of `space`
is committed (`do_update_network_policy`); the sandboxes app applies it to the running
sandboxes whose backends take it live.
"""

from django.dispatch import Signal

login_sessions_ended = Signal()
network_policy_changed = Signal()
