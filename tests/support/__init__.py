"""Harnesses shared by several test modules (interpreters of rendered configuration, places on
this machine to connect to)."""
