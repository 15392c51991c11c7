from pto_patch.cli import main

main()
