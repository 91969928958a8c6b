#!/usr/bin/env python3
"""A local stand-in for the Hugging Face hub and its CDN, for the hub tests (stdlib only).

Two HTTP servers on 127.0.0.1, random free ports: the hub answers
  HEAD/GET /{org}/{name}/resolve/{revision}/{file}   as huggingface.co does: X-Repo-Commit, ETag,
      for LFS files a 302 to the CDN with X-Linked-Etag (the sha256) and X-Linked-Size; error codes
      in X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo);
  GET /api/models/{org}/{name}/revision/{revision}    the model info (sha, siblings);
and the CDN (another origin, as cdn-lfs is) serves the bytes with Range requests.

The config (JSON, read again at every request; a changed text resets the fault counters) says what is served and which faults to inject:
  {"repos": {"ORG/NAME": {"commit": "<40 hex>", "files": {"F.gguf": {"path": "...", "lfs": true},
                                                          "README.md": {"text": "..."}},
                          "private": false, "gated": false, "status": 500}},
   "token": "hf_...",            # what private repos need as Bearer
   "cut_after": N, "cut_count": K,  # the next K CDN bodies drop the connection after N bytes
   "corrupt": false,             # the CDN flips one byte in the middle of the file
   "ignore_range": false,        # the CDN answers 200 with the whole file to Range requests
   "advertise_size": null,       # X-Linked-Size to claim instead of the real one
   "expire_links": false}        # each signed CDN link serves one request, then answers 403
Every request is logged as one JSON line (server, method, path, range, authorization).

  python3 fake_hub.py --config cfg.json --ports ports.json --log requests.jsonl
writes {"hub": PORT, "cdn": PORT} to ports.json once both listen, and serves until killed.
"""
import argparse
import hashlib
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class State:
    def __init__(self, config_path, log_path):
        self.config_path = config_path
        self.log_path = log_path
        self.lock = threading.Lock()
        self.text = None
        self.config = {}
        self.cuts_left = 0
        self.blobs = {}  # sha256 -> bytes
        self.cdn_port = 0
        self.links_issued = 0
        self.links_used = set()

    def current(self):
        with self.lock:
            with open(self.config_path) as f:
                text = f.read()
            if text != self.text:
                self.config = json.loads(text)
                self.text = text
                self.cuts_left = int(self.config.get("cut_count", 0))
                for repo in self.config.get("repos", {}).values():
                    for spec in repo.get("files", {}).values():
                        if spec.get("lfs"):
                            data = file_bytes(spec)
                            self.blobs[hashlib.sha256(data).hexdigest()] = data
            return self.config

    def new_link(self):
        with self.lock:
            self.links_issued += 1
            return self.links_issued

    def use_link(self, link):
        """False when the link was used before (expired)."""
        with self.lock:
            if link in self.links_used:
                return False
            self.links_used.add(link)
            return True

    def take_cut(self):
        with self.lock:
            if self.cuts_left > 0:
                self.cuts_left -= 1
                return True
            return False

    def log(self, entry):
        with self.lock:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")


def file_bytes(spec):
    if "path" in spec:
        with open(spec["path"], "rb") as f:
            return f.read()
    return spec.get("text", "").encode()


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None
    role = "hub"

    def log_message(self, fmt, *args):
        pass

    def log_request_entry(self):
        self.state.log({"server": self.role, "method": self.command, "path": self.path,
                        "range": self.headers.get("Range"),
                        "authorization": self.headers.get("Authorization")})

    def send(self, status, headers=None, body=b"", head=False):
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def error(self, status, code, message, head, extra=None):
        headers = {"X-Error-Code": code, "X-Error-Message": message,
                   "Content-Type": "application/json"}
        headers.update(extra or {})
        self.send(status, headers, json.dumps({"error": message}).encode(), head)

    def do_HEAD(self):
        self.handle_any(head=True)

    def do_GET(self):
        self.handle_any(head=False)

    def handle_any(self, head):
        self.log_request_entry()
        config = self.state.current()
        path = unquote(urlsplit(self.path).path)
        if self.role == "cdn":
            return self.serve_cdn(config, path, head)
        parts = path.strip("/").split("/")
        if len(parts) >= 6 and parts[0] == "api" and parts[1] == "models" and parts[4] == "revision":
            return self.serve_info(config, "/".join(parts[2:4]), "/".join(parts[5:]), head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.serve_resolve(config, "/".join(parts[:2]), parts[3], "/".join(parts[4:]),
                                      head)
        self.error(404, "NotFound", "no such route", head)

    def repo_or_error(self, config, repo_id, head):
        repo = config.get("repos", {}).get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.", head)
            return None
        if "status" in repo:
            self.error(int(repo["status"]), "ServerError", "Internal Error", head)
            return None
        if repo.get("private") and self.headers.get("Authorization") != "Bearer " + config.get("token", ""):
            self.error(401, "RepoNotFound", "Invalid username or password.", head)
            return None
        if repo.get("gated") and self.headers.get("Authorization") != "Bearer " + config.get("token", ""):
            self.error(403, "GatedRepo", "Access to this model is restricted.", head)
            return None
        return repo

    def serve_info(self, config, repo_id, revision, head):
        repo = self.repo_or_error(config, repo_id, head)
        if repo is None:
            return
        if revision not in ("main", repo["commit"]):
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        body = json.dumps({"id": repo_id, "sha": repo["commit"],
                           "siblings": [{"rfilename": f} for f in sorted(repo["files"])]}).encode()
        self.send(200, {"Content-Type": "application/json"}, body, head)

    def serve_resolve(self, config, repo_id, revision, file, head):
        repo = self.repo_or_error(config, repo_id, head)
        if repo is None:
            return
        commit = repo["commit"]
        if revision not in ("main", commit):
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        spec = repo["files"].get(file)
        if spec is None:
            return self.error(404, "EntryNotFound", f"{file} does not exist on \"{revision}\"", head,
                              {"X-Repo-Commit": commit})
        data = file_bytes(spec)
        if spec.get("lfs"):
            sha = hashlib.sha256(data).hexdigest()
            size = config.get("advertise_size") or len(data)
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
            headers = {"X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha}"',
                       "X-Linked-Size": str(size), "ETag": f'"{git_sha1(pointer.encode())}"',
                       "Location": f"http://127.0.0.1:{self.state.cdn_port}/cdn/{sha}"
                                   f"?signed={self.state.new_link()}"}
            return self.send(302, headers, b"", head)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_sha1(data)}"',
                   "Content-Type": "application/octet-stream"}
        self.send(200, headers, data, head)

    def serve_cdn(self, config, path, head):
        sha = path.rsplit("/", 1)[-1]
        data = self.state.blobs.get(sha)
        if data is None:
            return self.send(404, {}, b"no such blob", head)
        if config.get("expire_links"):
            query = urlsplit(self.path).query
            if not self.state.use_link(query):
                return self.send(403, {"Content-Type": "text/plain"}, b"Request has expired\n",
                                 head)
        if config.get("corrupt"):
            mid = len(data) // 2
            data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]
        start = 0
        status = 200
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        rng = self.headers.get("Range")
        if rng and not config.get("ignore_range"):
            start = int(rng.split("=", 1)[1].split("-", 1)[0])
            if start >= len(data):
                return self.send(416, {"Content-Range": f"bytes */{len(data)}"}, b"", head)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        cut = config.get("cut_after")
        if cut is not None and self.state.take_cut():
            self.wfile.write(body[:int(cut)])
            self.wfile.flush()
            # A cut connection: no more bytes, the socket closed without a proper end.
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)


def serve(config, ports, log):
    state = State(config, log)
    state.current()

    def make(role):
        handler = type(f"{role.title()}Handler", (Handler,), {"state": state, "role": role})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        return server

    hub, cdn = make("hub"), make("cdn")
    state.cdn_port = cdn.server_address[1]
    for s in (hub, cdn):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    tmp = ports + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"hub": hub.server_address[1], "cdn": cdn.server_address[1]}, f)
    os.replace(tmp, ports)
    return hub, cdn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--ports", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    serve(args.config, args.ports, args.log)
    # Gone with the test that started it, even when that one crashed.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)


if __name__ == "__main__":
    main()
