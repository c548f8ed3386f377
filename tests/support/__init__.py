"""Harnesses: every module the tests import that holds no test. By subject:

- the console and its services as real processes: `console_process`, `daphne_settings`,
  `killed_process`, `sqlite_rerun`, `warm_manage` (starts of `manage.py`), `engine_proxy`,
  `tls_engine`, `browser` (Chromium);
- places on this machine to connect to: `netns`, `egress_lab`, `egress_support`,
  `inbound_world`, `file_server` with the package sources `package_index` and
  `npm_source`, and `network_guard` (no name looked up off the machine);
- readers of rendered configuration: `nft_reader`, `dnsmasq_reader`, `squid_reader`,
  `docker_readback`, `remote_egress`, and the policy agreement's `agreement_table`,
  `agreement`, `agreement_lab`;
- the contract every backend passes: `backend_conformance`;
- helpers by room: `jobs` (an admin job run to its end), `terminal_support`,
  `pause_support`, `skills`, `skill_install`, `log_capture`, and the URLconfs `oidc_urls`, `redaction_urls`.

Fixtures stay in the conftest files; a fixture a harness defines is imported by the conftest
(or the module) that needs it.
"""
