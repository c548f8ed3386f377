"""Egress: the refused attempts read back from backends (`log`), live application of a
changed policy to running sandboxes (`live`), approvals and session grants (`approvals`),
and the "would this be allowed?" evaluator (`explain`, pure). docs/network.md.

May import sandboxes.models, sandboxes.backends, sandboxes.catalog and sandboxes.sessions;
the pages and the API import it.
"""
