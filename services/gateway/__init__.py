"""The gateway: runwire's HTTP face (its own API with Server-Sent Events), a client of the
other services over NATS through the SDK only."""
