"""`python -m services.relay`."""

from services.relay.main import main

main()
