"""pto-patch injection template: keep checkpoint key conversions for the renamed classes.

Appended at the end of the patched modeling module. RENAMED_CLASSES becomes a dict literal
{original class name: renamed class name} of the file's PreTrainedModel classes. The function
picks what to do by what the installed transformers has, not by its version:
- a VLMS list (4.57 in modeling_utils, 5.0 in conversion_mapping): a class uses its
  `_checkpoint_conversion_mapping` only when its name contains an entry, so add the renamed names;
- get/register_checkpoint_conversion_mapping keyed by class name (5.16+): custom code only gets
  mappings registered under its own class name, so copy the original class's mapping.
Where neither exists it does nothing.
"""


def _pto_patch_keep_checkpoint_conversions(renamed_classes):
    """Give the renamed classes the checkpoint key conversions transformers has for the original ones."""
    import importlib

    modules = []
    for module_name in ("transformers.modeling_utils", "transformers.conversion_mapping"):
        try:
            modules.append(importlib.import_module(module_name))
        except ImportError:
            pass
    for module in modules:
        vlms = getattr(module, "VLMS", None)
        if not isinstance(vlms, list):
            continue
        for original, renamed in renamed_classes.items():
            if any(name in original.lower() for name in vlms) and renamed.lower() not in vlms:
                vlms.append(renamed.lower())
    for module in modules:
        get_mapping = getattr(module, "get_checkpoint_conversion_mapping", None)
        register_mapping = getattr(module, "register_checkpoint_conversion_mapping", None)
        if get_mapping is None or register_mapping is None:
            continue
        for original, renamed in renamed_classes.items():
            mapping = get_mapping(original)
            if mapping is not None:
                register_mapping(renamed, mapping, overwrite=True)


_pto_patch_keep_checkpoint_conversions(RENAMED_CLASSES)
