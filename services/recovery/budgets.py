"""Budgets: reservations nobody will settle (their attempt is gone, or their run ended)
are closed. Whether their call happened is not known, so they are charged what they
reserved; an effect's reservation whose effect was never dispatched is released."""

from runwire.runtime.store import Store


class OrphanedReservations:
    """The duty that closes budget reservations left by crashed attempts."""

    name = "orphaned reservations"

    def __init__(self, store: Store) -> None:
        self.store = store

    async def run(self) -> dict[str, int]:
        return {"reservations_closed": await self.store.close_orphaned_reservations()}
