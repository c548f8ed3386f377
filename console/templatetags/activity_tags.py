"""`{% activity_charts %}`: the dashboard's activity charts (platform admins; nothing for
anyone else, the series being platform-wide). One line in a template: `{% load activity_tags %}
{% activity_charts %}`."""

from __future__ import annotations

from typing import Any

from django import template

from ..access import is_platform_admin
from ..activity_charts import DASHBOARD_CHARTS, DEFAULT_WINDOW, build_charts

register = template.Library()


@register.inclusion_tag("console/partials/activity_charts.html", takes_context=True)
def activity_charts(context: template.Context, window: str = DEFAULT_WINDOW) -> dict[str, Any]:
    request = context.get("request")
    if request is None or not is_platform_admin(request.user):
        return {"show": False}
    charts = build_charts(window)
    return {
        "show": True,
        "charts": charts,
        "chart_list": charts.by_id(*DASHBOARD_CHARTS),
        "only": ",".join(DASHBOARD_CHARTS),
        "csp_nonce": context.get("csp_nonce", ""),  # its script tags carry the page's nonce
    }
