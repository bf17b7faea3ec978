"""A tiny Hugging Face Hub on 127.0.0.1 for tests: model repos in the Hub's URL scheme, served to
the real huggingface_hub client (HF_ENDPOINT pointed at it); nothing inside the client is mocked.

What the client asks of it (huggingface_hub 1.x/2.x):
  GET  /api/models/ORG/NAME/revision/REV          repo info: sha, siblings
  GET  /api/models/ORG/NAME/tree/REV?recursive=.. the file listing (one page, no Link header)
  HEAD /ORG/NAME/resolve/REV/PATH                 X-Repo-Commit, ETag, Content-Length of a file
  GET  /ORG/NAME/resolve/REV/PATH                 its bytes
Failures carry the Hub's X-Error-Code (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound),
from which the client raises its own exception types. Xet headers are never sent, so the client
downloads over plain HTTP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import os
import threading
import urllib.parse

TOKEN = "hf_tinyhub_token"  # the one token that opens gated repos


@dataclasses.dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + hashlib.sha1(self.files[path]).digest())
        return digest.hexdigest()


def repo_from_directory(directory: str, gated: bool = False) -> Repo:
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, directory)] = open(path, "rb").read()
    return Repo(files, gated)


class TinyHub:
    """Serves `repos` (repo id -> Repo) until stopped; `url` is the HF_ENDPOINT to use; `requests`
    counts the requests answered."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos, self.requests = repos, 0
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler, body: bool) -> None:
        self.requests += 1
        url = urllib.parse.urlsplit(handler.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = "/".join(parts[2:4]), parts[4:]
            kind = rest[0] if rest else "revision"
            revision, path = (rest[1] if len(rest) > 1 else "main"), "/".join(rest[2:])
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, kind, revision, path = "/".join(parts[:2]), "resolve", parts[3], "/".join(parts[4:])
        else:
            return self.send(handler, 404, b"", body, {"X-Error-Code": "RepoNotFound"})
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.send(handler, 401, b"", body, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        if repo.gated and handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.send(handler, 403, b"", body, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this repo is restricted"})
        if revision not in ("main", repo.sha):
            return self.send(handler, 404, b"", body, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id"})
        if kind == "revision":
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False, "gated": repo.gated and "manual",
                    "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
            return self.send(handler, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
        if kind == "tree":
            listing = [{"type": "file", "path": p, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                       for p, data in sorted(repo.files.items()) if p.startswith(path)]
            return self.send(handler, 200, json.dumps(listing).encode(), body, {"Content-Type": "application/json"})
        if kind == "resolve":
            if path not in repo.files:
                return self.send(handler, 404, b"", body, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
            data = repo.files[path]
            return self.send(handler, 200, data, body, {"X-Repo-Commit": repo.sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        return self.send(handler, 404, b"", body, {"X-Error-Code": "RepoNotFound"})

    @staticmethod
    def send(handler, status: int, data: bytes, body: bool, headers: dict) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
