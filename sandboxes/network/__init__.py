"""A space's network policy in use, every console-side consumer of its meaning in one room:
`explain` ("would this be allowed, and by which rule?", pure, `netpolicy.decide`), `advice`
(what a refusal offers: `refusal_advice` over `netpolicy.advise`, and explain's answer for a
space), `checks` (the policy against each config's backend), `live` (a changed policy applied
to running sandboxes), `approvals` (allow for the space or a session), `log` (refusals read
back from the backends), and their `pages` and agent `api` routes. docs/network.md.

May import sandboxes.models, sandboxes.backends, sandboxes.catalog and sandboxes.sessions;
its pages also `sandboxes.pages.lookups`, its API routes (`api`) `sandboxes.api` (auth,
wire format, errors). The pages', the API's and the console's URLconfs route to it.
"""
