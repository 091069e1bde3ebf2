"""`python -m nandoctor` runs the command-line interface."""

from nandoctor.cli import main

main()
