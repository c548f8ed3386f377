"""Routes of the Pools pages (namespace "sandboxes", joined in `sandboxes.urls`)."""

from django.urls import path

from . import pages

urlpatterns = [
    path("spaces/<uuid:space_id>/pools/", pages.space_pools, name="space_pools"),
    path("spaces/<uuid:space_id>/pools/<uuid:config_id>/size/", pages.pool_size, name="pool_size"),
    path("platform/pools/", pages.platform_pools, name="platform_pools"),
]
