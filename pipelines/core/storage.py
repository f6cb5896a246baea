"""One filesystem layer for every path tidegauge reads or writes: local paths and URIs alike.

Users run the nightly jobs where their data lives: local disk for a trial, then HDFS or an object store on a
cluster whose executors share no disk with the driver. Every path a command takes (sources, `--out`, `--state`,
`--history`, the report's inputs, configuration files) goes through `locate`, which gives a `Location`: a pyarrow
filesystem and the path on it. pyarrow's filesystems are the library: S3 (`s3://`, and Hadoop's spellings
`s3a://` and `s3n://`), GCS (`gs://`), Azure (`abfs://`, `abfss://`), HDFS (`hdfs://`, through libhdfs) and local
disk (plain paths, `file://`). Spark is never handed a storage path: executors open the same URIs with the same
library, so what the driver checked is what a task reads, and no Hadoop connector jars are needed.

Credentials come from where each client looks by itself (environment such as `AWS_ACCESS_KEY_ID` /
`AWS_ENDPOINT_URL`, `~/.aws`, instance metadata, `GOOGLE_APPLICATION_CREDENTIALS`, `AZURE_STORAGE_*`); tidegauge
passes nothing, stores nothing and never prints them. On a cluster the executors need the same environment
(`spark.executorEnv.*`, or the nodes' own roles); see docs/spark.md.

A plain path is made absolute on the driver (`locate` and `absolute`): an executor resolving a relative path in
its own working directory would read nothing, or something else.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow.fs as pafs

# Hadoop's names for the S3 connector; pyarrow knows the bucket by the plain scheme.
_ALIASES = {"s3a": "s3", "s3n": "s3", "abfss": "abfs"}
# Stores where a rename copies (not atomic), and where one object written in one request appears whole or not at
# all: a directory is published with a pointer object instead of renames (pipelines.core.output).
OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


class StorageError(OSError):
    """A path that cannot be opened (unknown scheme, missing client library, unreachable store); the message names
    the path as the user gave it."""


def scheme(uri: str | os.PathLike) -> str:
    """The URI's scheme as pyarrow knows it ('' for a plain path, 'file', 's3', 'gs', 'abfs', 'hdfs', ...)."""
    text = os.fspath(uri)
    if "://" not in text:
        return ""
    s = text.split("://", 1)[0].lower()
    return _ALIASES.get(s, s)


def is_local(uri: str | os.PathLike) -> bool:
    return scheme(uri) in ("", "file")


def absolute(uri: str | os.PathLike) -> str:
    """A plain path or `file://` URI made absolute here (on the driver); other URIs unchanged."""
    text = os.fspath(uri)
    if text.startswith("file://"):
        return "file://" + os.path.abspath(os.path.expanduser(text[len("file://") :]))
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


@lru_cache(maxsize=64)
def _filesystem(uri_root: str) -> pafs.FileSystem:
    """One client per store (scheme and authority) per process: building an S3 client costs milliseconds and
    opens connections."""
    fs, _ = pafs.FileSystem.from_uri(uri_root)
    return fs


_LOCAL = pafs.LocalFileSystem()


def locate(uri: str | os.PathLike | Location) -> Location:
    """The Location of a plain path or URI (a Location is returned as it is). Raises StorageError naming `uri`
    when no filesystem serves it."""
    if isinstance(uri, Location):
        return uri
    text = absolute(uri)
    s = scheme(text)
    if s in ("", "file"):
        path = text[len("file://") :] if s == "file" else text
        return Location(_LOCAL, path, text)
    rest = text.split("://", 1)[1]
    normal = f"{s}://{rest}"
    authority = rest.split("/", 1)[0]
    try:
        fs = _filesystem(f"{s}://{authority}/")
        if s in (
            "s3",
            "gs",
        ):  # bucket/key: no second client built just to parse the path (tasks call this per file)
            path = rest.split("?", 1)[0]
        else:
            _, path = pafs.FileSystem.from_uri(normal)
    except (OSError, ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if s == "hdfs":
            hint = " (pyarrow's HDFS client needs libhdfs, JAVA_HOME and the Hadoop CLASSPATH on every node)"
        raise StorageError(f"{text}: cannot open: {first}{hint}") from None
    return Location(fs, path.rstrip("/"), text.rstrip("/"))


@dataclass(frozen=True)
class Location:
    """A file or directory on some filesystem: `fs` and `path` are pyarrow's, `uri` is what messages show."""

    fs: pafs.FileSystem
    path: str
    uri: str

    def __str__(self) -> str:
        return self.uri

    def __truediv__(self, name: str) -> Location:
        return Location(self.fs, posixpath.join(self.path, name), _join(self.uri, name))

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> Location:
        uri_parent = self.uri.rsplit("/", 1)[0] if "/" in self.uri.split("://", 1)[-1] else self.uri
        return Location(self.fs, posixpath.dirname(self.path), uri_parent)

    @property
    def kind(self) -> str:
        """'local', 's3', 'gcs', 'abfs', 'hdfs', ... (pyarrow's type name)."""
        return self.fs.type_name

    @property
    def is_object_store(self) -> bool:
        return self.kind in OBJECT_STORES

    @property
    def local(self) -> Path | None:
        """The local path, or None on any other filesystem."""
        return Path(self.path) if self.kind == "local" else None

    def info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def children(self) -> list[Location]:
        """The entries directly inside this directory, sorted by name ([] when it does not exist)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [self / posixpath.basename(i.path) for i in sorted(infos, key=lambda i: i.path)]

    def files(self, suffix: str = "", hidden: bool = False) -> list[Location]:
        """Every file under this directory (recursively), sorted; names starting with '.' or '_' are skipped
        (with what they hold) unless `hidden`, as Spark and the archive readers skip them."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        out = []
        for i in infos:
            if i.type != pafs.FileType.File or not i.path.endswith(suffix):
                continue
            rel = posixpath.relpath(i.path, self.path)
            if not hidden and any(part.startswith((".", "_")) for part in rel.split("/")):
                continue
            out.append(self / rel)
        return sorted(out, key=lambda loc: loc.path)

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Readers see the old content or all of the new, never part: on an object store one upload is
        published whole when it completes; elsewhere a temporary file is renamed into place."""
        if self.kind == "local":
            from div.checkpoint import atomic_write

            atomic_write(Path(self.path), data)
            return
        if self.is_object_store:
            with self.fs.open_output_stream(self.path) as f:
                f.write(data)
            return
        tmp = self.parent / f".{self.name}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(tmp.path) as f:
            f.write(data)
        tmp.move_to(self)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def move_to(self, other: Location) -> None:
        """Rename (same filesystem; atomic on local disk and HDFS, not on object stores)."""
        self.fs.move(self.path, other.path)

    def makedirs(self) -> None:
        """Create the directory (and its parents). Nothing on object stores: a prefix exists through the objects
        under it, and an empty marker object would only clutter listings."""
        if not self.is_object_store:
            self.fs.create_dir(self.path, recursive=True)

    def remove(self) -> None:
        """Delete this file or directory tree (nothing when absent)."""
        t = self.info().type
        if t == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif t == pafs.FileType.File:
            self.fs.delete_file(self.path)


def _join(uri: str, name: str) -> str:
    return uri.rstrip("/") + "/" + name
