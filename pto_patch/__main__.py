from pto_patch.cli.app import main

main()
