"""What writes and undoes a model folder: the plan of a patch, and its two writers (the engine in place,
the overlay beside the source), put_back and restore, the manifest, file I/O, the lock, hashes, the patch
state, the config fix, the rewrite cache, the tuning file and the codemods; and what a run reads of a
folder, once, before it loads (`run_folder`: the folder check, the watch of its files, the originals a
reference is rebuilt from, its own kernel package). Imports only `model` (and
`errors`, `resources`); nothing of `run`, `tune`, `serving` or `cli`.

Below the writers: `plan` (what both write) and `put_back` (what a manifest recorded, removed or put back).
"""
