"""vLLM: the plugin vLLM loads through its entry point (`vllm_plugin`, kept light: vLLM imports it in every
process), its layer classes (`vllm_layers`), `verify --engine vllm` (`vllm_verify`) and the process that runs
one engine (`vllm_engine`). Imports `run` and below.
"""
