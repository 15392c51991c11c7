"""What verify, bench, demo and tune share: a run of the patched model, from its plan to timing;
and, in packages of their own, three concerns built on it or under it.

The core, here:
- `options`: the options every run shares, checked before anything loads
- `device`: device and dtype choice, synchronisation, peak memory
- `loading`: one load (remote code), the rope fixes, load info, versions; `hub_kernels`: `--hub-kernels`
- `inputs`: prompt, image and batch; `image_inputs`: one image and a prompt as the model's inputs
- `generation`: greedy generation, both modes timed side by side, the comparison; `noise`: a ratio's band
- `op_choice`: which ops are switched on, and whether they ran; `patchers`: other patchers that bypass the guard
- `start`: options read once into a plan (the folder read once, under its lock: `patching.run_folder`), one load
- `verify`, `bench`, `demo`: the proving commands
- `report`: every command's JSON document; `report_folder`, `user_files`: where reports and named files go

The concerns:
- `graph/`: torch.compile and graph capture (below the core: imports none of it)
- `ocr/`: OCR pages, their scoring, `verify --ocr` and `bench --ocr` (above the core)
- `diagnosis/`: `doctor` and the Ascend release pairs (above the core; imports nothing of `ocr/`)
"""
