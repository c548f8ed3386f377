"""`python -m sandboxes.backends.docker.egress`: start the refusal log reader (ulogd2)."""

from .component import main

raise SystemExit(main())
