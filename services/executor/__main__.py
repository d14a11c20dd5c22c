"""`python -m runwire.executor`."""

from runwire.executor.main import main

main()
