"""`runwire-gateway` (or `python -m runwire.gateway`): the gateway under uvicorn."""

import logging

import uvicorn

from runwire.client.settings import from_env
from runwire.gateway.app import create_app
from runwire.gateway.settings import GatewaySettings


def main() -> None:
    settings = from_env(GatewaySettings)
    logging.basicConfig(level=settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=5,
        limit_concurrency=settings.gateway_max_connections,
        ssl_certfile=settings.gateway_tls_cert,
        ssl_keyfile=settings.gateway_tls_key,
    )
