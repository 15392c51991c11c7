"""`pto-patch download`: fetch a model folder from the Hugging Face hub and check that it is complete.

The transfer is huggingface_hub's `snapshot_download` into a plain folder (`local_dir`), with the
hub's own progress bars and environment (HF_TOKEN, HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE,
HF_HUB_DISABLE_PROGRESS_BARS). Around it this module adds what a user on a slow, gated or offline
link needs:

- one `model_info` call first: it pins the revision to a commit and lists every file with its size,
  so errors surface before any byte is written and the disk space can be checked up front;
- a completeness check afterwards (config, every shard of the index with its listed size and a
  consistent safetensors header, tokenizer and processor files);
- a record of the commit (`.pto_patch_download.json`), written last, so `status` can show it and a
  folder never looks complete after a failed run;
- one-line errors with a hint for the failures people actually meet.

Resume: within one run huggingface_hub resumes a dropped transfer with a Range request (from the last
10 MiB chunk it received). Across runs (Ctrl-C, a crash, a server error) every file that finished is
kept and skipped, and the file that was cut off is fetched again from its start: huggingface_hub 2.4
writes each file under a per-process temporary name that it deletes when the transfer fails.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch import __version__
from pto_patch.errors import DownloadError
from pto_patch.hub import hub_errors
from pto_patch.model import input_files
from pto_patch.model.folder import DOWNLOAD_RECORD, read_download_record
from pto_patch.model.spec import ModelSpec, load_spec
from pto_patch.patching import folder_lock
from pto_patch.patching.patch_state import COMPLETE, DRIFTED, IN_PROGRESS, state_before_writing

INDEX_FILE = "model.safetensors.index.json"
# Where huggingface_hub keeps its per-file metadata inside a local_dir download.
HUB_METADATA_DIR = Path(".cache") / "huggingface"
TOKENIZER_FILES = (("tokenizer_config.json",), ("tokenizer.json", "vocab.json"))
PROCESSOR_FILES = ("preprocessor_config.json",)
# Room left beyond the files themselves (temporary names, metadata), in bytes.
DISK_MARGIN = 64 * 1024 * 1024


@dataclass(frozen=True)
class DownloadResult:
    repo_id: str
    revision: str
    commit: str | None
    folder: Path
    files: int
    total_size: int
    fetched: tuple[str, ...]
    already_present: tuple[str, ...]
    complete: bool
    offline: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    record: Path | None = None

    @property
    def checked_only(self) -> bool:
        """Nothing had to be transferred: the folder was already complete."""
        return not self.fetched

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "folder": str(self.folder),
            "files": self.files,
            "total_size": self.total_size,
            "fetched": list(self.fetched),
            "already_present": list(self.already_present),
            "checked_only": self.checked_only,
            "complete": self.complete,
            "offline": self.offline,
            "include": list(self.include),
            "exclude": list(self.exclude),
            "elapsed_s": round(self.elapsed_s, 3),
            "record": str(self.record) if self.record else None,
        }


@dataclass(frozen=True)
class _Listing:
    """What the hub says the revision holds: its commit, and each wanted file with its size."""

    commit: str
    sizes: dict[str, int | None] = field(default_factory=dict)


# --- environment ---------------------------------------------------------------------------------


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _offline() -> bool:
    from huggingface_hub import constants

    # huggingface_hub reads HF_HUB_OFFLINE once, at import; read it again so a caller's change counts.
    return constants.HF_HUB_OFFLINE or _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def _endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip()
    return value.rstrip("/") or None


def _cache_dir() -> str | None:
    """The hub cache from HF_HUB_CACHE / HF_HOME as they are now (huggingface_hub read them at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _shown_endpoint() -> str:
    from huggingface_hub import constants

    return _endpoint() or constants.ENDPOINT


# --- folder resolution ---------------------------------------------------------------------------


def _output_folder(output_dir: str | Path | None, spec: ModelSpec) -> Path:
    if output_dir is None:
        from_env = os.environ.get(spec.model_path_env, "").strip()
        if not from_env:
            raise DownloadError(
                f"no folder to download into: neither --output-dir nor ${spec.model_path_env} is set",
                f"pass --output-dir DIR, or export {spec.model_path_env}=DIR",
                exit_code=2,
            )
        output_dir = from_env
    folder = Path(output_dir).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise DownloadError(f"{folder} exists and is not a folder", "pick another --output-dir")
    _refuse_patched(folder)
    # The folder is created only once the hub answered; find now whether it can be at all.
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise DownloadError(
            f"cannot create {folder}: {ancestor} is a file, not a folder", "pick another --output-dir"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise DownloadError(
            f"cannot create or write {folder}: {ancestor} is not writable",
            "pick a folder you can write to, or fix its permissions",
        )
    return folder


def _refuse_patched(folder: Path) -> None:
    state = state_before_writing(folder)
    if state in (COMPLETE, DRIFTED):
        raise DownloadError(
            f"{folder} holds an applied pto-patch patch; downloading over it would undo half of it",
            f"run `pto-patch restore --model-path {folder}` first, then download again",
        )
    if state == IN_PROGRESS:
        raise DownloadError(
            f"{folder} holds an interrupted pto-patch apply; downloading over it would mix its files with the hub's",
            f"run `pto-patch restore --model-path {folder}` first (it rolls the apply back), then download again",
        )


# --- completeness ---------------------------------------------------------------------------------


def size_problems(folder: Path, sizes: dict[str, int | None]) -> list[str]:
    """Each listed file that is missing or whose size differs from the size the hub lists."""
    problems = []
    for relative, expected in sorted(sizes.items()):
        path = folder / relative
        if not path.is_file():
            problems.append(f"{relative} is missing")
        elif expected is not None and path.stat().st_size != expected:
            problems.append(f"{relative} has {path.stat().st_size} bytes, the hub lists {expected}")
    return problems


def model_problems(folder: Path, spec: ModelSpec) -> list[str]:
    """What keeps `folder` from being a complete checkpoint of the spec's model type; empty if complete."""
    problems: list[str] = []
    config_path = folder / "config.json"
    try:
        config = input_files.load_json(config_path)
    except FileNotFoundError:
        problems.append("config.json is missing")
    except (OSError, ValueError) as exc:
        problems.append(f"config.json is unreadable ({exc})")
    else:
        found = config.get("model_type") if isinstance(config, dict) else None
        if found != spec.model_type:
            problems.append(f"config.json has model_type {found!r}, expected {spec.model_type!r}")

    shards: set[str] = set()
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        try:
            shards = set(input_files.load_json(index_path)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{INDEX_FILE} is unreadable ({exc})")
    elif (folder / "model.safetensors").is_file():
        shards = {"model.safetensors"}
    else:
        problems.append(f"neither {INDEX_FILE} nor model.safetensors is present")
    for shard in sorted(shards):
        path = folder / shard
        if not path.is_file():
            problems.append(f"{shard} (named by {INDEX_FILE}) is missing")
        elif problem := input_files.safetensors_problem(path):
            problems.append(problem)

    for alternatives in TOKENIZER_FILES:
        if not any((folder / name).is_file() for name in alternatives):
            problems.append(f"tokenizer file {' or '.join(alternatives)} is missing")
    for name in PROCESSOR_FILES:
        if not (folder / name).is_file():
            problems.append(f"processor file {name} is missing")
    return problems


def lacking_in_repo(files: dict[str, int | None] | list[str]) -> list[str]:
    """What a complete folder needs that the repository's file list does not hold at all."""
    wanted = [
        ("config.json",),
        (INDEX_FILE, "model.safetensors"),
        *TOKENIZER_FILES,
        *((n,) for n in PROCESSOR_FILES),
    ]
    kinds = {"config.json": "config", INDEX_FILE: "weights", "preprocessor_config.json": "processor file"}
    lacking = []
    for alternatives in wanted:
        if not any(name in files for name in alternatives):
            kind = kinds.get(alternatives[0], "tokenizer file")
            lacking.append(f"{kind} {' or '.join(alternatives)}")
    return lacking


def completeness_problems(
    folder: Path, spec: ModelSpec, sizes: dict[str, int | None] | None = None
) -> list[str]:
    """Everything that keeps `folder` from being complete; `sizes` (path -> hub size) adds size checks."""
    return size_problems(folder, sizes or {}) + model_problems(folder, spec)


# --- the hub ----------------------------------------------------------------------------------------


def _list_revision(repo_id: str, revision: str | None, token: str | None, include, exclude) -> _Listing:
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi(endpoint=_endpoint(), token=token)
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    if not info.sha:
        raise DownloadError(
            f"the hub at {_shown_endpoint()} gave no commit for {repo_id}",
            "check HF_ENDPOINT: it must point at a Hugging Face hub (or a mirror of one)",
        )
    siblings = {sibling.rfilename: sibling.size for sibling in info.siblings or []}
    wanted = filter_repo_objects(
        items=list(siblings), allow_patterns=list(include) or None, ignore_patterns=list(exclude) or None
    )
    return _Listing(commit=info.sha, sizes={name: siblings[name] for name in wanted})


def _present(folder: Path, sizes: dict[str, int | None]) -> list[str]:
    return sorted(
        name
        for name, size in sizes.items()
        if (folder / name).is_file() and (size is None or (folder / name).stat().st_size == size)
    )


def _check_disk_space(folder: Path, listing: _Listing, present: list[str]) -> None:
    missing = sum(size or 0 for name, size in listing.sizes.items() if name not in present)
    if not missing:
        return
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < missing + DISK_MARGIN:
        raise DownloadError(
            f"not enough disk space in {probe}: the download needs {_gb(missing)}, {_gb(free)} is free",
            "free some space, or pass --output-dir on a larger disk",
        )


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def _forget_bad_files(folder: Path, sizes: dict[str, int | None]) -> None:
    """Delete files whose size is wrong, and huggingface_hub's note of them, so a rerun fetches them again."""
    for name, expected in sizes.items():
        path = folder / name
        if path.is_file() and expected is not None and path.stat().st_size != expected:
            path.unlink()
            (folder / HUB_METADATA_DIR / "download" / f"{name}.metadata").unlink(missing_ok=True)


def _write_record(folder: Path, document: dict[str, Any]) -> Path:
    path = folder / DOWNLOAD_RECORD
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


# --- entry point -------------------------------------------------------------------------------------


def download_model(
    model: str = "gutenocr_3b",
    model_id: str | None = None,
    output_dir: str | Path | None = None,
    revision: str | None = None,
    token: str | None = None,
    include: tuple[str, ...] | list[str] = (),
    exclude: tuple[str, ...] | list[str] = (),
) -> DownloadResult:
    """Download `model_id` (default: the spec's hub repo) into `output_dir` and check it is complete."""
    started = time.perf_counter()
    spec = load_spec(model)
    repo_id = model_id or spec.hub_repo_id
    folder = _output_folder(output_dir, spec)
    include, exclude = tuple(include), tuple(exclude)

    if _offline():
        return _check_offline(folder, spec, repo_id, revision, include, exclude, started)

    try:
        listing = _list_revision(repo_id, revision, token, include, exclude)
    except DownloadError:
        raise
    except Exception as exc:
        if hub_errors.unreachable(exc) and read_download_record(folder) and not model_problems(folder, spec):
            # No route to the hub, but a finished download is here: check it locally, as offline mode does.
            return _check_offline(folder, spec, repo_id, revision, include, exclude, started)
        mapped = hub_errors.translate(exc, repo_id, revision, folder, spec, _shown_endpoint())
        if mapped is None:
            raise
        raise mapped from exc
    if not listing.sizes:
        raise DownloadError(
            f"no file of {repo_id} matches --include {list(include)} / --exclude {list(exclude)}",
            "loosen the patterns (they are shell-style globs such as '*.json')",
        )

    lacking = [] if include or exclude else lacking_in_repo(listing.sizes)
    if lacking:
        more = f" (nor {', '.join(lacking[1:])})" if len(lacking) > 1 else ""
        raise DownloadError(
            f"{repo_id} (commit {listing.commit[:12]}) has no {lacking[0]}{more}, so no folder downloaded "
            "from it can be complete",
            "rerunning cannot fetch what the repository lacks: pick a repository that ships it (--model-id), "
            "or download the rest with --include and copy the missing files in from the model it was made from",
        )

    present = _present(folder, listing.sizes)
    _check_disk_space(folder, listing, present)
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock.exclusive(folder):
        _refuse_patched(folder)  # an apply may have landed while the hub answered
        return _fetch(spec, repo_id, revision, token, include, exclude, folder, listing, started)


def _fetch(spec, repo_id, revision, token, include, exclude, folder, listing, started) -> DownloadResult:
    """Transfer the listed files into `folder` (whose lock is held), check it, and record the commit."""
    filtered = bool(include or exclude)
    present = _present(folder, listing.sizes)
    previous = read_download_record(folder)
    if previous is not None and previous.get("commit") != listing.commit:
        # The folder is about to change: until it checks out, it must not claim the old commit.
        (folder / DOWNLOAD_RECORD).unlink(missing_ok=True)

    # huggingface_hub trusts its note of a finished file; a file cut short or edited since must go first.
    _forget_bad_files(folder, listing.sizes)
    try:
        _transfer(repo_id, listing, folder, token, include, exclude)
    except Exception as exc:
        mapped = hub_errors.translate(exc, repo_id, revision, folder, spec, _shown_endpoint())
        if mapped is None:
            raise
        raise mapped from exc

    # With --include/--exclude only the selected files must be right; the folder may stay partial.
    missing_model_parts = model_problems(folder, spec)
    problems = size_problems(folder, listing.sizes) + ([] if filtered else missing_model_parts)
    if problems:
        _forget_bad_files(folder, listing.sizes)
        (folder / DOWNLOAD_RECORD).unlink(missing_ok=True)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DownloadError(
            f"the download into {folder} is incomplete: {problems[0]}{more}",
            "run the same command again to fetch what is missing",
        )
    complete = not missing_model_parts
    total = sum(size or 0 for size in listing.sizes.values())
    record = _write_record(
        folder,
        {
            "repo_id": repo_id,
            "revision": revision or "main",
            "commit": listing.commit,
            "endpoint": _shown_endpoint(),
            "files": dict(sorted(listing.sizes.items())),
            "total_size": total,
            "complete": complete,
            "include": list(include),
            "exclude": list(exclude),
            "tool": f"pto-patch {__version__}",
        },
    )
    return DownloadResult(
        repo_id=repo_id,
        revision=revision or "main",
        commit=listing.commit,
        folder=folder,
        files=len(listing.sizes),
        total_size=total,
        fetched=tuple(name for name in sorted(listing.sizes) if name not in present),
        already_present=tuple(present),
        complete=complete,
        include=include,
        exclude=exclude,
        elapsed_s=time.perf_counter() - started,
        record=record,
    )


def _transfer(repo_id: str, listing: _Listing, folder: Path, token: str | None, include, exclude) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(
        repo_id,
        revision=listing.commit,  # pinned: every file comes from the commit that was listed
        local_dir=str(folder),
        cache_dir=_cache_dir(),
        endpoint=_endpoint(),
        token=token,
        allow_patterns=list(include) or None,
        ignore_patterns=list(exclude) or None,
    )


def _check_offline(folder, spec, repo_id, revision, include, exclude, started) -> DownloadResult:
    """Offline: nothing is fetched; a folder that is already complete passes, anything else is an error."""
    record = read_download_record(folder) or {}
    sizes = record.get("files") if record.get("repo_id") == repo_id else None
    sizes = sizes if isinstance(sizes, dict) else None
    problems = (
        completeness_problems(folder, spec, sizes) if folder.is_dir() else ["the folder does not exist"]
    )
    if problems:
        raise DownloadError(
            f"offline mode is on (HF_HUB_OFFLINE) and {folder} is not complete: {problems[0]}",
            hub_errors.OFFLINE_HINT.format(env=spec.model_path_env),
        )
    files = sorted(sizes) if sizes else sorted(p.name for p in folder.iterdir() if p.is_file())
    return DownloadResult(
        repo_id=repo_id,
        revision=revision or record.get("revision") or "main",
        commit=record.get("commit"),
        folder=folder,
        files=len(files),
        total_size=sum((folder / name).stat().st_size for name in files if (folder / name).is_file()),
        fetched=(),
        already_present=tuple(files),
        complete=True,
        offline=True,
        include=include,
        exclude=exclude,
        elapsed_s=time.perf_counter() - started,
        record=folder / DOWNLOAD_RECORD if record else None,
    )
