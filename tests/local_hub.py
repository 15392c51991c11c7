"""A small Hugging Face hub on 127.0.0.1, for testing downloads with the real huggingface_hub client.

It speaks the part of the hub's HTTP API that `model_info` and `snapshot_download` use (checked
against huggingface_hub 2.4):

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: `sha` and `siblings` (with
  `size`, `blobId` and `lfs` when `?blobs=True`);
- `GET /api/models/{repo}/tree/{rev}?recursive=...`: the file list with sizes and LFS data;
- `HEAD` / `GET /{repo}/resolve/{rev}/{path}`: `X-Repo-Commit`, `ETag`, `Content-Length`,
  `Accept-Ranges`; LFS files (`*.safetensors`) answer with a redirect carrying `X-Linked-Etag` /
  `X-Linked-Size`, as the hub does, to a blob URL on the same server; `Range: bytes=N-` gets a 206;
- errors with the hub's `X-Error-Code` / `X-Error-Message` headers (RepoNotFound, GatedRepo,
  RevisionNotFound, EntryNotFound, invalid credentials).

Faults for tests: `cut[path] = n` sends only the first n bytes of the next full GET of that file and
drops the connection; `fail[path] = status` answers the next GET of that file with that status.
Every request is logged in `requests`. Loopback only; the server stops when the context exits.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors",)
REQUEST_TIMEOUT_S = 10  # a stuck client cannot hold a handler thread longer than this


def git_blob_id(data: bytes) -> str:
    """The object id git gives a file's content (what the hub reports as a file's blob id)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Snapshot:
    commit: str
    files: dict[str, bytes]


@dataclass
class Repo:
    repo_id: str
    revisions: dict[str, Snapshot] = field(default_factory=dict)  # branch / tag name -> snapshot
    token: str | None = None  # private: only this token may read it
    gated: bool = False

    def find(self, revision: str) -> Snapshot | None:
        if revision in self.revisions:
            return self.revisions[revision]
        return next((snap for snap in self.revisions.values() if snap.commit == revision), None)


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    authorization: str | None


def read_folder(folder: Path) -> dict[str, bytes]:
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.relative_to(folder).as_posix().startswith(".")
    }


class LocalHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.cut: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.requests: list[Logged] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- content --

    def add_repo(
        self,
        repo_id: str,
        revisions: dict[str, Path],
        *,
        token: str | None = None,
        gated: bool = False,
    ) -> Repo:
        repo = Repo(repo_id, token=token, gated=gated)
        for name, folder in revisions.items():
            files = read_folder(folder)
            digest = hashlib.sha1(f"{repo_id}@{name}".encode())
            for path, data in files.items():
                digest.update(path.encode() + hashlib.sha256(data).digest())
            repo.revisions[name] = Snapshot(commit=digest.hexdigest(), files=files)
        self.repos[repo_id] = repo
        return repo

    def gets(self, suffix: str = "") -> list[Logged]:
        """Logged GETs of file content whose path ends with `suffix`."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == "GET"
                and ("/resolve/" in r.path or "/blobs/" in r.path)
                and r.path.endswith(suffix)
            ]

    # -- lifecycle --

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalHub:
        hub = self

        class Handler(_HubHandler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _HubHandler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format, *args) -> None:  # noqa: A002 - keep test output quiet
        pass

    # -- plumbing --

    def _log(self) -> None:
        with self.hub._lock:
            self.hub.requests.append(
                Logged(
                    self.command,
                    urlsplit(self.path).path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                )
            )

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, document, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(document).encode()
        self._send(status, body, {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json({"error": message}, status, headers)

    def _access(self, repo: Repo | None) -> bool:
        """Answer the hub's errors for a missing, private or gated repo; True if access is granted."""
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return False
        sent = self.headers.get("Authorization")
        if repo.token is not None:
            if sent is None:
                # The hub does not reveal that a private repo exists.
                self._error(401, "RepoNotFound", "Repository not found")
                return False
            if sent != f"Bearer {repo.token}":
                self._error(401, None, "Invalid credentials in Authorization header")
                return False
        if repo.gated:
            self._error(403, "GatedRepo", f"Access to model {repo.repo_id} is restricted.")
            return False
        return True

    def _route(self) -> tuple[str, list[str], dict[str, list[str]]]:
        parts = urlsplit(self.path)
        return parts.path, [unquote(p) for p in parts.path.strip("/").split("/")], parse_qs(parts.query)

    # -- verbs --

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._log()
        path, segments, query = self._route()
        if segments[:2] == ["api", "models"] and len(segments) >= 4:
            return self._api(segments[2:], query)
        if len(segments) >= 5 and segments[2] == "resolve":
            return self._resolve(segments)
        if len(segments) == 4 and segments[2] == "blobs":
            return self._blob(segments)
        self._error(404, None, f"no route for {path}")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    # -- API --

    def _api(self, rest: list[str], query: dict[str, list[str]]) -> None:
        repo = self.hub.repos.get("/".join(rest[:2]))
        if not self._access(repo):
            return
        tail = rest[2:]
        if not tail:
            kind, revision = "revision", "main"
        elif len(tail) == 2 and tail[0] in ("revision", "tree"):
            kind, revision = tail
        else:
            return self._error(404, None, "no such API route")
        snapshot = repo.find(revision)
        if snapshot is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if kind == "tree":
            return self._json(
                [{"type": "file", **self._file_entry(snapshot, name)} for name in snapshot.files]
            )
        with_blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for name in snapshot.files:
            entry = {"rfilename": name}
            if with_blobs:
                info = self._file_entry(snapshot, name)
                entry.update(size=info["size"], blobId=info["oid"])
                if "lfs" in info:
                    entry["lfs"] = {"size": info["size"], "sha256": info["lfs"]["oid"], "pointerSize": 134}
            siblings.append(entry)
        self._json(
            {
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": snapshot.commit,
                "private": repo.token is not None,
                "gated": False,
                "siblings": siblings,
            }
        )

    @staticmethod
    def _file_entry(snapshot: Snapshot, name: str) -> dict:
        data = snapshot.files[name]
        entry = {"path": name, "size": len(data), "oid": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    # -- files --

    def _resolve(self, segments: list[str]) -> None:
        repo = self.hub.repos.get("/".join(segments[:2]))
        if not self._access(repo):
            return
        snapshot = repo.find(segments[3])
        if snapshot is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {segments[3]}")
        name = "/".join(segments[4:])
        if name not in snapshot.files:
            return self._error(404, "EntryNotFound", f"{name} does not exist at this revision")
        data = snapshot.files[name]
        if name.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            return self._send(
                302,
                headers={
                    "Location": f"/{repo.repo_id}/blobs/{sha256}",
                    "X-Repo-Commit": snapshot.commit,
                    "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(len(data)),
                },
            )
        self._content(name, data, {"X-Repo-Commit": snapshot.commit, "ETag": f'"{git_blob_id(data)}"'})

    def _blob(self, segments: list[str]) -> None:
        repo = self.hub.repos.get("/".join(segments[:2]))
        if not self._access(repo):
            return
        for snapshot in repo.revisions.values():
            for name, data in snapshot.files.items():
                if hashlib.sha256(data).hexdigest() == segments[3]:
                    headers = {"X-Repo-Commit": snapshot.commit, "ETag": f'"{segments[3]}"'}
                    return self._content(name, data, headers)
        self._error(404, "EntryNotFound", "no such blob")

    def _content(self, name: str, data: bytes, headers: dict[str, str]) -> None:
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        if self.command == "HEAD":
            return self._send(200, headers={**headers, "Content-Length": str(len(data))})
        with self.hub._lock:
            status = self.hub.fail.pop(name, None)
        if status is not None:
            return self._error(status, None, "injected failure")
        start = 0
        wanted = self.headers.get("Range")
        if wanted:
            if not wanted.startswith("bytes=") or not wanted[6:].rstrip("-").isdigit():
                return self._error(416, None, "unsupported range")
            start = int(wanted[6:].rstrip("-"))
            if start >= len(data):
                return self._send(416, headers={"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        with self.hub._lock:
            cut_at = self.hub.cut.pop(name, None) if not wanted else None
        if cut_at is not None:
            # Promise the whole body, send part of it, and drop the connection.
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body[:cut_at])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(206 if wanted else 200, body, headers)
