"""Locate the modeling source to rewrite, without importing torch or transformers."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import SourceNotFoundError
from pto_patch.model.spec import ModelSpec


@dataclass(frozen=True)
class ModelSources:
    modeling: Path
    configuration: Path
    release: str  # the transformers release the source belongs to (or is installed beside it)
    from_folder: bool  # the model folder shipped its own modeling file
    source_release: str | None = None  # where the folder's own file comes from (model/source_release.py)

    @property
    def origin(self) -> str:
        """The release the modeling file comes from, as apply's summary and the banner say it."""
        return self.source_release or self.release


def installed_transformers_release() -> str | None:
    """transformers' installed version, as `importlib.metadata.version` gives it: the `Version:` of
    the first `transformers-*.dist-info` (or `.egg-info`) on sys.path. Read directly, since importing
    importlib.metadata (its email parser) costs more than a whole `pto-patch status`; where no such
    folder is found, importlib.metadata has the last word."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing folder
            continue
        for name in names:
            if name.lower().startswith("transformers-") and name.endswith((".dist-info", ".egg-info")):
                version = _metadata_version(Path(entry or ".") / name)
                if version is not None:
                    return version
    import importlib.metadata

    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def _metadata_version(info_dir: Path) -> str | None:
    for file_name in ("METADATA", "PKG-INFO"):
        try:
            with open(info_dir / file_name, encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.removeprefix("Version:").strip()
                    if not line.strip():  # the headers end at the first blank line
                        break
        except OSError:
            continue
    return None


def installed_transformers_dir() -> Path | None:
    found = importlib.util.find_spec("transformers")  # a top-level find_spec imports nothing
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0])


def locate_sources(folder: Path, spec: ModelSpec) -> ModelSources:
    """The folder's own modeling file if it ships one, else the installed transformers' files."""
    release = installed_transformers_release()
    own_modeling = Path(folder) / spec.modeling_file
    package_dir = installed_transformers_dir()
    if release is None or package_dir is None:
        if own_modeling.is_file():
            raise SourceNotFoundError(
                "transformers is not installed, and the patched model needs it to load",
                "pip install 'transformers>=4.57'",
            )
        raise SourceNotFoundError(
            "transformers is not installed, so there is no modeling source to patch",
            "pip install 'transformers>=4.57'",
        )
    model_dir = package_dir / "models" / spec.transformers_model_dir
    installed_modeling = model_dir / spec.modeling_file
    installed_configuration = model_dir / spec.configuration_file
    own_configuration = Path(folder) / spec.configuration_file
    if own_modeling.is_file():
        configuration = own_configuration if own_configuration.is_file() else installed_configuration
        if not configuration.is_file():
            raise SourceNotFoundError(
                f"{folder} ships {spec.modeling_file} but not {spec.configuration_file}, and "
                f"transformers {release} has none at {installed_configuration}",
                f"install a transformers release that has models/{spec.transformers_model_dir}",
            )
        from pto_patch.model.source_release import folder_source_release

        origin = folder_source_release(Path(folder), own_modeling, installed_modeling, release)
        return ModelSources(own_modeling, configuration, release, from_folder=True, source_release=origin)
    if not installed_modeling.is_file() or not installed_configuration.is_file():
        family = spec.family
        raise SourceNotFoundError(
            f"transformers {release} has no {family.title} ({spec.name}'s family): no {spec.modeling_file} "
            f"under {model_dir}",
            f"pto-patch patches {family.title} from transformers {family.supported_from} on: "
            f"pip install 'transformers>={family.supported_from},<6'",
        )
    return ModelSources(installed_modeling, installed_configuration, release, from_folder=False)
