"""The console's URLconf plus one view that fails, quoting its query string in the error."""

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import urlpatterns as console_urlpatterns


def failing_view(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(f"could not handle {request.GET.urlencode()}")


urlpatterns = [path("failing/", failing_view), *console_urlpatterns]

handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"
