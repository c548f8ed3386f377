"""The HTML pages of the sandboxes app: configs, the template catalog, sessions, API tokens,
platform backends (`views`, `platform`), their forms (`forms`) and routes (`urls`).

Pages call services and the runtime only, never an adapter directly.
May import: `sandboxes.sessions`, `sandboxes.catalog`, `sandboxes.api` (token writes), `sandboxes.network`
(the policy page and the session page's refusals),
`sandboxes.backends` (the contract's DTOs and errors), `sandboxes.models`, `console`.
Nothing imports the pages but the URLconf.
"""
