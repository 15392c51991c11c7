"""The PyPTO kernels' tilings as data (`tile_table`), what their matmul tiles take of an AI Core's buffers
(`tile_budget`), and the cost-model measurements the tables were chosen from (`tile_search.json`). Imports
nothing of the package above it."""
