"""support-desk: a runwire runner that answers questions about orders with a tool."""
