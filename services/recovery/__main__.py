"""`python -m runwire.recovery`."""

from runwire.recovery.main import main

main()
