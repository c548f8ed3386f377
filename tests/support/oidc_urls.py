"""The console's URLconf with single sign-on on (console/urls.py adds these when OIDC_RP_CLIENT_ID is set)."""

from django.urls import include, path

from console.urls import urlpatterns as console_urlpatterns

urlpatterns = [path("oidc/", include("mozilla_django_oidc.urls")), *console_urlpatterns]
