"""Budgets: reservations nobody will settle (their attempt is gone, or their run ended)
are released, so what they held counts against no budget any more."""

from runwire.runtime.store import Store


class OrphanedReservations:
    """The duty that releases budget reservations left by crashed attempts."""

    name = "orphaned reservations"

    def __init__(self, store: Store) -> None:
        self.store = store

    async def run(self) -> dict[str, int]:
        return {"released": await self.store.release_orphaned_reservations()}
