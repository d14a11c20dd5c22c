"""The runwire Python SDK and the `runwire` CLI. Imports only `contracts`."""

from services.client.sdk import Client, ClientError, Transcript

__all__ = ["Client", "ClientError", "Transcript"]
