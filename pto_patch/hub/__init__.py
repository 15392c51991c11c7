"""Where a model folder comes from: the Hub (`download`, its errors turned into messages), or the tiny
stand-in built here (`make-tiny`). Imports `patching` (the lock, the patch state) and `model`.
"""
