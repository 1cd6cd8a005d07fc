"""Airflow's login in front of the plugin's pages.

The API server mounts a plugin's FastAPI app as it is: no router dependency and no middleware of
Airflow's authenticates it. Every route of the app therefore depends on `require_plugin_viewer`,
which uses Airflow's own pieces: `get_user` (a bearer token in the Authorization header first,
else the `_token` cookie the UI sets at login) and `requires_access_view(AccessView.PLUGINS)`, the
auth manager's permission to view plugins. Anonymous: 401; a forged or revoked token: 403; an
expired one: 401; a user without that permission: 403.

Airflow is imported when a request arrives, not when the plugin loads: other Airflow processes
load plugins too, and need none of the API server's modules.
"""

from __future__ import annotations

import asyncio
import html

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse


async def require_plugin_viewer(request: Request) -> None:
    """Returns when the request carries a valid Airflow token of a user allowed to view plugins;
    raises HTTPException 401 or 403 otherwise."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user, requires_access_view

    user = await get_user(request, None, await bearer_scheme(request))
    # The auth manager may ask its database: off the event loop, as FastAPI runs Airflow's own check.
    await asyncio.to_thread(requires_access_view(AccessView.PLUGINS), request, user)


def _login_url(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=request.url.path)


def install_refusal_pages(app: FastAPI) -> None:
    """A refusal is a small HTML page with a link to Airflow's login (a browser is the usual
    caller), with the refusal's status code and no detail beyond Airflow's own short reason."""

    @app.exception_handler(HTTPException)
    async def refusal(request: Request, exc: HTTPException) -> HTMLResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        link = ""
        if exc.status_code in (401, 403):
            link = f'<p><a id="login" href="{html.escape(_login_url(request))}">Log in to Airflow</a></p>'
        body = (f"<!doctype html><html><head><meta charset='utf-8'><title>Lakehouse health</title></head><body>"
                f"<h1>Lakehouse health</h1><p id='refused'>{html.escape(str(exc.detail))}</p>{link}</body></html>")
        return HTMLResponse(body, status_code=exc.status_code, headers=headers)
