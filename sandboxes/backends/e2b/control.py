"""The E2B control plane's HTTP client: one guarded httpx client per backend, requests with
retries and backoff, and cursor-paged lists (a part of `E2BBackend`).

Imports nothing of the project but `sandboxes.backends` (the contract and the guard) and this
package's `common`.
"""

from __future__ import annotations

import builtins
import random
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from ..base import BackendConfig, ErrorKind, RemoteError
from ..guard import GuardedTransport, Resolver
from .common import CONNECT_RETRIES, MAX_BACKOFF_S, status_error, transport_error


class E2BControlPlane:
    """Requests to the control plane (`<endpoint>`), and the retrying `_send` the data plane
    uses too."""

    if TYPE_CHECKING:  # provided by E2BBackend
        config: BackendConfig
        api_url: str
        request_timeout: float
        retries: int
        resolver: Resolver
        sleep: Callable[[float], None]
        _http: httpx.Client | None
        _lock: threading.Lock

    @property
    def http(self) -> httpx.Client:
        """One client per backend; every request goes through the guarded transport."""
        if self._http is None:
            with self._lock:
                if self._http is None:
                    transport = GuardedTransport(
                        allow_private=self.config.allow_private_endpoints, resolver=self.resolver
                    )
                    self._http = httpx.Client(
                        transport=transport,
                        timeout=httpx.Timeout(self.request_timeout or None, connect=10.0),
                        follow_redirects=False,
                        headers={"User-Agent": "sandbox-console"},
                    )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def _api_headers(self) -> dict[str, str]:
        return {"X-API-Key": self.config.api_key}

    def _send(
        self,
        method: str,
        url: str,
        what: str,
        *,
        idempotent: bool,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        control: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request with retries: rate_limited and unavailable answers (and connection
        failures) are retried with exponential backoff, honouring Retry-After, but only for
        idempotent calls. Any other failure is raised as a RemoteError at once."""
        attempt = 0
        while True:
            try:
                response = self.http.request(
                    method,
                    url,
                    headers=headers,
                    timeout=httpx.Timeout(timeout, connect=10.0) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                    **kwargs,
                )
                error = None if response.status_code < 300 else status_error(response, what, control=control)
            except RemoteError:
                raise
            except Exception as exc:
                error = transport_error(exc, what)
                if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                    # Nothing reached the server: safe to retry whatever the call.
                    error = RemoteError(ErrorKind.UNAVAILABLE, error.message)
                    # Fewer tries than for a busy server: a refused connection rarely heals
                    # within seconds, and pages that ask a dead endpoint should not hang.
                    if attempt < min(self.retries, CONNECT_RETRIES):
                        attempt += 1
                        self.sleep(self._backoff(attempt, None))
                        continue
                raise error from exc
            if error is None:
                return response
            retry = idempotent and error.kind in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE)
            if not retry or attempt >= self.retries:
                raise error
            attempt += 1
            self.sleep(self._backoff(attempt, error.retry_after))

    @staticmethod
    def _backoff(attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_BACKOFF_S)
        return min(0.25 * 2 ** (attempt - 1), MAX_BACKOFF_S) * (0.5 + random.random() / 2)  # noqa: S311

    def _api(
        self,
        method: str,
        path: str,
        what: str,
        *,
        idempotent: bool,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        return self._send(
            method,
            self.api_url + path,
            what,
            idempotent=idempotent,
            timeout=timeout,
            headers={**self._api_headers(), **(headers or {})},
            control=True,
            **kwargs,
        )

    def paged_rows(self, path: str, what: str, params: Mapping[str, Any] | None = None) -> builtins.list[Any]:
        """Every row of a cursor-paged list; a repeated cursor stops with an error."""
        rows: builtins.list[Any] = []
        token: str | None = None
        seen: set[str] = set()
        while True:
            query = {**(params or {}), "limit": 100, **({"nextToken": token} if token else {})}
            response = self._api("GET", path, what, idempotent=True, params=query)
            rows.extend(response.json())
            token = response.headers.get("x-next-token") or None
            if not token:
                return rows
            if token in seen:
                raise RemoteError(ErrorKind.INTERNAL, f"{what}: the server repeated a page token", retryable=False)
            seen.add(token)
