"""`python -m services.executor`."""

from services.executor.main import main

main()
