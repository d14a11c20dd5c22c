"""`python -m services.submitter`."""

from services.submitter.main import main

main()
