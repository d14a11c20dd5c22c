"""The runwire Python SDK and the `runwire` CLI. Imports only `contracts`."""

from runwire.client.sdk import Client, ClientError, Transcript

__all__ = ["Client", "ClientError", "Transcript"]
