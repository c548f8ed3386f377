"""Inbound traffic to sandbox ports through the console: the ASGI proxy route (`proxy`), and
the page and API views that hand out its URLs and signed links (`views`)."""
