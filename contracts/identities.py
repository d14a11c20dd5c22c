"""The names of runwire's identities on NATS: each service's, the gateway's, each
tenant's, the operator's. A deployment's broker configuration (`runwire.infra.auth`)
gives each its rights; a client connects as one and tells from its name what it may see
(a tenant's own runs, or everything an operator reads)."""

SERVICES = ("submitter", "executor", "relay", "recovery")
# The gateway: a client of the others, acting for each tenant a key names.
GATEWAY = "gateway"
# The stack's operator: every tenant's commands, the admin commands among them.
OPERATOR = "operator"
# A tenant has one NATS user, or two while its credentials rotate: `tenant-<name>` and
# `tenant-<name>.next`, in turn the current one (nats-server holds one password per user,
# and on a reload closes the connections whose user's password changed: so a rotation
# adds a user and never changes one). No tenant's name has a dot.
ALTERNATE = ".next"
_SERVICE = "svc-"
_TENANT = "tenant-"


def service_user(service: str) -> str:
    """The NATS user of a service (or of the gateway)."""
    return f"{_SERVICE}{service}"


def tenant_user(tenant: str) -> str:
    """A tenant's NATS user (its first; see ALTERNATE)."""
    return f"{_TENANT}{tenant}"


def is_tenant_user(user: str) -> bool:
    """Whether `user` is one of a tenant's NATS users (not a service's, the operator's)."""
    return user.startswith(_TENANT)


def tenant_of_user(user: str) -> str:
    """The tenant a `tenant-...` user is one of."""
    return user.removeprefix(_TENANT).removesuffix(ALTERNATE)
