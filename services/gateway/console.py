"""The web console's files: one page, its script and its style, served with a
Content-Security-Policy that lets the page run only the gateway's own script, load
nothing from elsewhere and talk only to this gateway."""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

STATIC = Path(__file__).parent / "static"
# What each file is served as; nothing else under static/ is served.
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
FILES = {
    path.name: TYPES[path.suffix]
    for path in sorted(STATIC.iterdir())
    if path.suffix in TYPES and path.name != "console.html"
}
# No inline script or style, no eval, nothing from another origin; the page may not be
# framed (clickjacking) nor send a form anywhere.
POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def mount(app: FastAPI) -> None:
    """Serve the console at `/` and its files under `/console/`."""

    @app.get("/", include_in_schema=False)
    async def console() -> Response:
        """The web console: one page, no build step."""
        page = (STATIC / "console.html").read_bytes()
        return Response(page, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/console/{name}", include_in_schema=False)
    async def console_file(name: str) -> Response:
        """A script or the style of the console."""
        media = FILES.get(name)
        if media is None:
            return Response("no such file\n", 404, media_type="text/plain", headers=HEADERS)
        body = (STATIC / name).read_bytes()
        return Response(body, media_type=f"{media}; charset=utf-8", headers=HEADERS)
