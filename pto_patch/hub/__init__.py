"""Where a model folder comes from: the Hub (`download`, its errors turned into messages). Imports
`patching` (the lock, the patch state) and `model`; the offline tiny stand-in is `pto_patch.tiny`.
"""
