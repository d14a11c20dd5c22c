"""`python -m runwire.submitter`."""

from runwire.submitter.main import main

main()
