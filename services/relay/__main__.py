"""`python -m runwire.relay`."""

from runwire.relay.main import main

main()
