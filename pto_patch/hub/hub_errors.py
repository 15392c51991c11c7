"""The hub client's failures, each mapped to one line and a hint, whichever huggingface_hub is installed.

huggingface_hub 0.x talks HTTP through requests, 1.x through httpx, 2.x through httpx2; the hub's
own errors (gated, not found, ...) keep their names across the three. Tests run `download` under
each major (tests/test_download_hubs.py).
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import DownloadError
from pto_patch.model.spec import ModelSpec

OFFLINE_HINT = (
    "on an offline machine, copy a complete model folder from a machine with access and point "
    "{env} (or --model-path) at it"
)


@dataclass(frozen=True)
class _HttpErrors:
    """The exception classes of the HTTP library under the installed huggingface_hub."""

    unreachable: tuple[type[BaseException], ...]  # no connection, or it timed out
    broken: tuple[type[BaseException], ...]  # the transfer broke off


def _http_errors() -> _HttpErrors:
    """hub 0.x talks through requests, 1.x through httpx, 2.x through httpx2: take whichever are installed."""
    unreachable: list[type[BaseException]] = []
    broken: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        if importlib.util.find_spec(name) is not None:
            module = importlib.import_module(name)
            unreachable += [module.ConnectError, module.TimeoutException]
            broken.append(module.TransportError)
    if importlib.util.find_spec("requests") is not None:
        import requests

        unreachable += [requests.exceptions.ConnectionError, requests.exceptions.Timeout]
        broken += [requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError]
    return _HttpErrors(tuple(unreachable), tuple(broken))


def unreachable(exc: BaseException) -> bool:
    from huggingface_hub import errors as hf_errors

    return isinstance(exc, (*_http_errors().unreachable, hf_errors.OfflineModeIsEnabled))


def translate(
    exc: BaseException, repo_id: str, revision: str | None, folder: Path, spec: ModelSpec, endpoint: str
):
    """A DownloadError for a known failure of the hub client, or None."""
    from huggingface_hub import errors as hf_errors

    http = _http_errors()

    offline_hint = OFFLINE_HINT.format(env=spec.model_path_env)
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return DownloadError(
            f"offline mode is on (HF_HUB_OFFLINE) and {folder} is not complete", offline_hint
        )
    if isinstance(exc, hf_errors.GatedRepoError):
        return DownloadError(
            f"{repo_id} is gated and this account has not been granted access",
            f"accept the model's conditions on {endpoint}/{repo_id} with the account of your token "
            "(--token or HF_TOKEN)",
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return DownloadError(
            f"revision '{revision}' not found in {repo_id}",
            "pass a branch, tag or commit that exists in the repository, or drop --revision for main",
        )
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return DownloadError(
            f"repository {repo_id} not found on {endpoint} (or it is private and no valid token was sent)",
            "check --model-id; for a private repository pass --token or set HF_TOKEN",
        )
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            return DownloadError(
                f"the hub at {endpoint} rejected the token (401 invalid credentials)",
                "check --token / HF_TOKEN (a read token from your account's settings), or unset it",
            )
        if status == 403:
            return DownloadError(
                f"the hub at {endpoint} refused access to {repo_id} (403)",
                "use a token whose permissions include reading this repository",
            )
        return DownloadError(
            f"the hub at {endpoint} answered {status} while downloading {repo_id}",
            "try again later; rerunning resumes and keeps the files that finished",
        )
    if isinstance(exc, (*http.unreachable, hf_errors.LocalEntryNotFoundError)):
        return DownloadError(
            f"cannot reach the hub at {endpoint} and {folder} is not complete",
            f"check the network, proxy and HF_ENDPOINT; {offline_hint}",
        )
    if isinstance(exc, http.broken):
        return DownloadError(
            f"the transfer from {endpoint} broke off ({type(exc).__name__})",
            "run the same command again: finished files are kept and the rest resumes",
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            f"disk full while writing into {folder}",
            "free some space (or pass --output-dir on a larger disk), then run the same command again",
        )
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return DownloadError(
            f"a file from {repo_id} arrived with the wrong size",
            "run the same command again: the file is fetched anew",
        )
    return None
