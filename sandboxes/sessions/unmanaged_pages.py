"""The platform's Unmanaged resources page: what the backends hold under this installation's
labels that no live object owns (`sessions.unmanaged`), with a delete action (a confirm page,
audited). Platform admins only; anyone else gets 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_safe

from console.access import require_platform_admin
from console.services import ServiceError, actor_from_request

from ..backends.base import RemoteError
from ..catalog.lookups import failure_message
from .unmanaged import ORDER, do_delete_unmanaged, find_unmanaged


@login_required
@require_safe
def unmanaged_list(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    listing = find_unmanaged()
    return render(request, "sandboxes/unmanaged_list.html", {"listing": listing, "section": "unmanaged"})


@login_required
@require_http_methods(["GET", "POST"])
def unmanaged_delete(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    data = request.POST if request.method == "POST" else request.GET
    backend_id, kind, ident = (str(data.get(name, "")) for name in ("backend", "kind", "ident"))
    if kind not in ORDER or not ident or not backend_id:
        messages.error(request, "Choose a resource from the list.")
        return redirect("sandboxes:unmanaged_list")
    if request.method == "GET":
        return render(
            request,
            "inc/confirm_delete.html",
            {
                "object_label": f"unmanaged {kind} {ident}",
                "consequences": [
                    f"The {kind} is deleted from its backend, once listed again and found owned by no space, "
                    "config or session of this console.",
                    "Whatever it held is lost; the deletion is audited.",
                ],
                "hidden": {"backend": backend_id, "kind": kind, "ident": ident},
                "cancel_url": reverse("sandboxes:unmanaged_list"),
                "section": "unmanaged",
            },
        )
    try:
        item = do_delete_unmanaged(backend_id, kind, ident, actor=actor_from_request(request))
    except (ServiceError, RemoteError) as exc:
        messages.error(request, failure_message(exc))
    else:
        messages.success(request, f"Deleted {item.kind} {item.ident} from {item.backend_name}.")
    return redirect("sandboxes:unmanaged_list")
