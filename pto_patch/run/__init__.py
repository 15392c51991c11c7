"""What verify, bench, demo and tune share: a run of the patched model, from the folder check to timing.

- `options`: the options every run shares, checked before anything loads
- `device`: device and dtype choice, synchronisation, peak memory
- `folder`: the folder's patch state, and its own `pto_kernels` imported
- `loading`: one load (remote code), the rope fixes, load info, versions
- `compiling`: torch.compile or ACL graph, and what the compiler did in each mode
- `inputs`: prompt, image and batch
- `generation`: greedy generation, both modes timed side by side, the comparison
- `ops`: which ops are switched on, and whether they ran
- `patchers`: other patchers that bypass the injected guard
- `start`: options, folder and load in the order every command needs
"""
