"""`python -m supervisor.cli ...`, the same as the `supervisor` console script."""

from .main import main

main()
