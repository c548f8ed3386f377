"""A space's network policy in use, every console-side consumer of its meaning in one room:
`explain` ("would this be allowed, and by which rule?", pure, `netpolicy.decide`), `advice`
(what a refusal offers: `refusal_advice` over `netpolicy.advise`, and explain's answer for a
space), `checks` (the policy against each config's backend), `live` (a changed policy applied
to running sandboxes), `approvals` (allow for the space or a session), `log` (refusals read
back from the backends), their `pages` (with the space page's Network policy card and the
session page's Egress card, registered in `SandboxesConfig.ready()`), `urls` and agent `api`
routes. docs/network.md. (`catalog/network.py`, the policy as the `NetworkSpec` a backend is
sent at create, stays with the catalog: the catalog's services and verification send it.)

May import sandboxes.models, sandboxes.backends, sandboxes.catalog and sandboxes.sessions;
its API routes (`api`) `sandboxes.api` (auth, wire format, errors). The app's, the API's
and the console's URLconfs route to it.
"""
