"""`python -m services.recovery`."""

from services.recovery.main import main

main()
