"""What every service shares: settings, the Postgres store, the NATS broker, logs, lifecycle."""

from importlib import metadata


def package_version() -> str:
    """The installed runwire version (health replies, trace resources)."""
    try:
        return metadata.version("runwire")
    except metadata.PackageNotFoundError:
        return "unknown"
