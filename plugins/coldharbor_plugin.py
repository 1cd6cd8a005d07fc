"""Registers Coldharbor with Airflow: the "Lakehouse health" page under Browse."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from coldharbor_airflow.health_page import app


class ColdharborPlugin(AirflowPlugin):
    name = "coldharbor"
    fastapi_apps = [{"app": app, "url_prefix": "/coldharbor", "name": "Coldharbor"}]
    external_views = [{"name": "Lakehouse health", "href": "coldharbor/health", "destination": "nav",
                       "category": "browse", "url_route": "lakehouse-health"}]
