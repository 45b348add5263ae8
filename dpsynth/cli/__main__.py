"""`python -m dpsynth.cli`: the same as the `dpsynth` command."""

from dpsynth.cli.app import main

main()
