"""What a model is: its spec (data), the catalog of specs, its folder and config, and where its modeling
source lies. Imports nothing of pto_patch but `errors` and `resources`.

- `spec`: a model as data (templates/specs/), the ops and blocks
- `catalog`: `models`, the specs listed
- `folder`: a model folder found and its config read
- `locate`: the modeling source a patch rewrites
- `injections_found`: which guards a source holds, read with `ast`
"""
