"""The tool the support agent calls: look an order up by its number."""

from pydantic import BaseModel, Field

import runwire

ORDERS = {
    "1042": {"status": "shipped", "carrier": "DHL"},
    "1043": {"status": "being packed", "carrier": None},
}


class OrderLookup(BaseModel):
    order_id: str = Field(pattern=r"^\d{1,12}$", description="The order's number")


@runwire.tool(input=OrderLookup)
async def lookup_order(args: OrderLookup) -> dict[str, object]:
    """Look up an order's status and carrier by its number."""
    order = ORDERS.get(args.order_id)
    if order is None:
        raise runwire.ToolError(f"there is no order {args.order_id}")
    return {"order_id": args.order_id, **order}
