"""`python -m pto_patch`: the same command line as `pto-patch`."""

from pto_patch.cli.app import main

main()
