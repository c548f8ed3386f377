"""The E2B adapter: sandboxes on E2B cloud or any E2B-compatible control plane.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""
