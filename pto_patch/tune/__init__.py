"""`tune`: measuring kernel choices over `run` (`tuning`), and choosing from measurements alone
(`selection`); the tuning file it writes lives in `patching.tuning_file`. Imports `run` and below.
"""
