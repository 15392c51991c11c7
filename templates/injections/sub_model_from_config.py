"""pto-patch injection template: build the renamed sub-models without AutoModel's class tables.

Appended at the end of the patched modeling module where the file builds a sub-model with
`AutoModel.from_config(config.<sub>_config)` (Qwen3-VL from transformers 5.16); the codemod points those calls
here. AutoModel finds a model by its config's class, and the renamed config classes are in none of its
tables; nor would registering them help, since the remote-code loader imports the configuration file twice
(once for AutoConfig, once beside the modeling file) and the config a model receives is of the other copy's
class. SUB_MODELS becomes a dict literal {renamed config class name: sub-model class}; a config it does not
name goes to AutoModel as before.
"""


def _pto_patch_sub_model_from_config(config, **kwargs):
    """AutoModel.from_config for this file's sub-models, found by the name of the config's class."""
    model_class = SUB_MODELS.get(type(config).__name__)
    if model_class is None:
        return AutoModel.from_config(config, **kwargs)
    return model_class._from_config(config, **kwargs)
