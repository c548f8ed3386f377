"""Models of the sandboxes app."""
