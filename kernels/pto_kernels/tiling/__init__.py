"""The PyPTO kernels' tilings as data (`tile_table`) and what their matmul tiles take of an AI Core's buffers
(`tile_budget`); the cost-model measurements the tables were chosen from stay in the repository
(`benchmarks/tile_search.json`), out of the package every patched folder receives. Imports nothing of the
package above it."""
