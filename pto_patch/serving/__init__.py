"""vLLM: the plugin vLLM loads through its entry point (`vllm_plugin`, kept light: vLLM imports it in every
process), its layer classes (`vllm_layers`), and `verify --engine vllm` (`vllm_verify`). Imports `run`
and below.
"""
