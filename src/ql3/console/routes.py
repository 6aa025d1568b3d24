"""Serves the console's static files. The page itself holds no data; it calls ``/api/v1``."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Final

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return resources.files("ql3.console").joinpath("static", name).read_bytes()


@router.get("/")
def index() -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/console/app.js")
def script() -> Response:
    return Response(_asset("app.js"), media_type="text/javascript; charset=utf-8", headers=_HEADERS)


@router.get("/console/charts.js")
def charts() -> Response:
    return Response(_asset("charts.js"), media_type="text/javascript; charset=utf-8", headers=_HEADERS)


@router.get("/console/admin.js")
def admin_script() -> Response:
    return Response(_asset("admin.js"), media_type="text/javascript; charset=utf-8", headers=_HEADERS)


@router.get("/console/app.css")
def style() -> Response:
    return Response(_asset("app.css"), media_type="text/css; charset=utf-8", headers=_HEADERS)


# A small mark for the browser tab, so no page load ends in a 404 for /favicon.ico.
_ICON: Final = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect width="16" height="16" rx="3" fill="#1a5fb4"/>'
    b'<path d="M4 8h8M8 4v8" stroke="#fff" stroke-width="2"/></svg>'
)


@router.get("/favicon.ico")
def icon() -> Response:
    return Response(_ICON, media_type="image/svg+xml", headers=_HEADERS)
