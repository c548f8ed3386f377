"""The Cube adapter: the E2B adapter plus Cube's differences.

Imports nothing of the project but `sandboxes.backends` (the contract, the guard, the E2B adapter).
"""
