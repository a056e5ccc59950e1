"""The package container: named parts with SHA-256 hashes, in one zip file or a directory.

A package is a set of *parts* (byte strings with relative paths) plus a
`manifest.json` that lists every other part with its size and SHA-256. This
module only moves bytes and enforces the rules that make reading a hostile
file safe; what the parts mean is package.py's business.

Rules the reader enforces before handing out a single byte:

* part paths are relative, made of ``[A-Za-z0-9_.-]`` components, with no
  ``.``/``..`` components, and listed once;
* a zip stores every member uncompressed (method STORED), so no member can
  expand beyond the bytes on disk (no zip bombs), and the members together
  may not claim more bytes than the archive holds (no overlapping members);
* every part the manifest lists exists, has the listed size and hash, and
  nothing else is in the package (no stray files a tool might pick up);
* a directory package holds regular files only: no FIFOs, devices or sockets, and links only to regular
  files inside it (a link that loops or leaves is refused); files are examined before they are opened and
  opened without following links or blocking;
* sizes (the manifest's, the file system's, `Limits`) are checked for every part before any is read, and
  parts are hashed in chunks as they stream in.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import zipfile
from typing import Any

from ..errors import PackageError
from .limits import Limits, resolve

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20
MAX_PARTS = 4096
MAX_JSON_DEPTH = 64
_PART_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_part_name(name: Any, where: str) -> str:
    """A part path that cannot leave the package, or PackageError saying why."""
    if not isinstance(name, str) or not _PART_NAME.match(name) or len(name) > 255:
        raise PackageError(f"{where}: part path {name!r} must be a relative path of [A-Za-z0-9_.-] components")
    if any(c in (".", "..") for c in name.split("/")):
        raise PackageError(f"{where}: part path {name!r} leaves the package or names a directory")
    return name


def _depth(value: Any, limit: int) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        if depth > limit:
            return depth
        nxt = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
    return depth


def _strict_int(what: str):
    def parse(text: str) -> int:
        if len(text.lstrip("-")) > 19 or not -(1 << 63) <= int(text) < (1 << 63):
            raise PackageError(f"{what}: the integer {text[:24]}{'...' if len(text) > 24 else ''} "
                               f"({len(text)} characters) is outside the 64-bit range")
        return int(text)

    return parse


def _finite_float(what: str):
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise PackageError(f"{what}: the number {text[:24]} is not finite (JSON numbers must be)")
        return value

    return parse


def _no_constant(what: str):
    def parse(text: str):
        raise PackageError(f"{what}: {text} is not JSON (non-finite numbers are written {{'$float': 'inf'}} in the IR)")

    return parse


def parse_json(data: bytes, what: str) -> Any:
    """JSON from untrusted bytes: UTF-8, bounded nesting, numbers that fit 64 bits and are finite, typed errors."""
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_strict_int(what), parse_float=_finite_float(what),
                           parse_constant=_no_constant(what))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise PackageError(f"{what}: not valid UTF-8 JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise PackageError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON true is not a size or an id)."""
    return isinstance(value, int) and not isinstance(value, bool)


def write(path: str | os.PathLike, manifest: dict, parts: dict[str, bytes]) -> None:
    """Write `parts` and the manifest (with a `parts` table of sizes and hashes added).

    A path ending in ``/`` or naming an existing directory gets the directory
    form; anything else a zip file.
    """
    path = os.fspath(path)
    for name in parts:
        check_part_name(name, "write")
        if name == MANIFEST:
            raise PackageError(f"write: {MANIFEST} is reserved for the manifest")
    manifest = dict(manifest)
    manifest["parts"] = {name: {"size": len(data), "sha256": sha256(data)} for name, data in sorted(parts.items())}
    blob = json.dumps(manifest, indent=1, sort_keys=False).encode()
    if path.endswith(os.sep) or os.path.isdir(path):
        for name, data in [(MANIFEST, blob), *parts.items()]:
            target = os.path.join(path, *name.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        return
    tmp = path + ".partial"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(MANIFEST, blob)
        for name, data in sorted(parts.items()):
            z.writestr(name, data)
    os.replace(tmp, path)


# -- reading: nothing but regular files, sizes checked before reading, hashed while streaming --------------
_CHUNK = 1 << 20
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "link")):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str, what: str) -> tuple[int, int]:
    """A descriptor and the size of a regular file, or PackageError.

    The file is examined with lstat before it is opened (so a FIFO or a device is never opened), opened
    without following a final link and without blocking, and examined again through the descriptor (so
    a file swapped in between is caught)."""
    try:
        before = os.lstat(path)
    except OSError as e:
        raise PackageError(f"{what}: cannot be examined ({e.strerror})") from None
    if not stat.S_ISREG(before.st_mode):
        raise PackageError(f"{what}: is a {_kind(before.st_mode)}, expected a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise PackageError(f"{what}: cannot be opened ({e.strerror})") from None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise PackageError(f"{what}: was replaced while being opened")
    return fd, now.st_size


def _stream(read, size: int, what: str) -> tuple[bytes, str]:
    """Exactly `size` bytes through read(n), in chunks, with their SHA-256; never more than size + 1 read."""
    digest, buf = hashlib.sha256(), bytearray()
    try:
        while len(buf) <= size:
            chunk = read(min(_CHUNK, size + 1 - len(buf)))
            if not chunk:
                break
            digest.update(chunk)
            buf += chunk
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, NotImplementedError) as e:
        raise PackageError(f"{what}: is damaged ({e})") from None
    if len(buf) != size:
        raise PackageError(f"{what}: holds {'more than ' if len(buf) > size else ''}{len(buf)} bytes, "
                           f"expected {size} (truncated, or changed while reading)")
    return bytes(buf), digest.hexdigest()


def _read_regular(path: str, size: int, what: str) -> tuple[bytes, str]:
    fd, _ = open_regular(path, what)
    try:
        return _stream(lambda n: os.read(fd, n), size, what)
    finally:
        os.close(fd)


_MAX_DIRECTORY_BYTES = (MAX_PARTS + 1) * 1024  # a member's record: 46 bytes, its name (<= 255), its extras


def _central_directory_size(f, size: int) -> int | None:
    """The size the archive's end record gives its central directory (ZIP64's when it defers to it), or
    None where there is no readable end record (zipfile then says what is wrong)."""
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None
    directory = int.from_bytes(tail[at + 12:at + 16], "little")
    if directory != 0xFFFFFFFF:
        return directory
    locator = tail[at - 20:at] if at >= 20 else b""
    if not locator.startswith(b"PK\x06\x07"):
        return None
    offset = int.from_bytes(locator[8:16], "little")
    if offset + 56 > size:
        return None
    f.seek(offset)
    record = f.read(56)
    return int.from_bytes(record[40:48], "little") if record.startswith(b"PK\x06\x06") else None


class _Zip:
    """A package archive opened safely: members checked, read in chunks."""

    def __init__(self, path: str, limits: Limits):
        fd, size = open_regular(os.path.realpath(path), path)  # the package itself may be reached through a link
        if size > limits.max_package_bytes:
            os.close(fd)
            raise limits.exceeded("max_package_bytes", size, f"{path}: the archive's size in bytes")
        self.file = os.fdopen(fd, "rb")
        directory = _central_directory_size(self.file, size)
        if directory is not None and directory > _MAX_DIRECTORY_BYTES:
            self.file.close()
            raise PackageError(f"{path}: the archive's directory is {directory} bytes, over {_MAX_DIRECTORY_BYTES} "
                               f"(room for {MAX_PARTS} members); zipfile would parse it all before any check")
        try:
            self.z = zipfile.ZipFile(self.file)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            self.file.close()
            raise PackageError(f"{path}: not a readable package archive ({e})") from None
        self.path = path
        infos = self.z.infolist()
        if len(infos) > MAX_PARTS + 1:
            self.close()
            raise PackageError(f"{path}: {len(infos)} members, more than the limit of {MAX_PARTS}")
        self.members: dict[str, zipfile.ZipInfo] = {}
        try:
            for info in infos:
                check_part_name(info.filename, path)
                if info.filename in self.members:
                    raise PackageError(f"{path}: member {info.filename!r} appears twice")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise PackageError(f"{path}: member {info.filename!r} is compressed (method {info.compress_type}); "
                                       "packages store members uncompressed")
                if info.flag_bits & 0x1:
                    raise PackageError(f"{path}: member {info.filename!r} is encrypted")
                self.members[info.filename] = info
            claimed = sum(i.file_size for i in infos)
            if claimed > size:
                raise PackageError(f"{path}: members claim {claimed} bytes but the archive holds {size} "
                                   "(overlapping or forged members)")
        except PackageError:
            self.close()
            raise

    def size(self, name: str) -> int:
        return self.members[name].file_size

    def read(self, name: str) -> tuple[bytes, str]:
        what = f"{self.path}: member {name!r}"
        try:
            f = self.z.open(self.members[name])
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, NotImplementedError) as e:
            raise PackageError(f"{what}: is damaged ({e})") from None
        with f:
            return _stream(f.read, self.members[name].file_size, what)

    def close(self) -> None:
        self.z.close()
        self.file.close()


class _Dir:
    """A directory package: every entry examined (regular files, or links to regular files inside it)."""

    def __init__(self, root: str):
        self.root = root
        self.real_root = os.path.realpath(root)
        self.files: dict[str, str] = {}  # part name -> the regular file it is
        stack, directories = [(root, "")], 0
        while stack:
            base, prefix = stack.pop()
            try:
                entries = list(os.scandir(base))
            except OSError as e:
                raise PackageError(f"{root}: directory {prefix or '.'} cannot be listed ({e.strerror})") from None
            for entry in entries:
                name = prefix + entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError as e:
                    raise PackageError(f"{root}: {name!r} cannot be examined ({e.strerror})") from None
                if stat.S_ISDIR(st.st_mode):
                    stack.append((entry.path, name + "/"))
                    directories += 1
                    if directories > MAX_PARTS:
                        raise PackageError(f"{root}: more than {MAX_PARTS} directories")
                    continue
                self.files[name] = self._regular(entry.path, name, st)
                if len(self.files) > MAX_PARTS + 1:
                    raise PackageError(f"{root}: more than {MAX_PARTS} files")

    def _regular(self, path: str, name: str, st: os.stat_result) -> str:
        where = f"{self.root}: {name!r}"
        if stat.S_ISREG(st.st_mode):
            return path
        if not stat.S_ISLNK(st.st_mode):
            raise PackageError(f"{where} is a {_kind(st.st_mode)}; a package holds only regular files")
        try:
            real = os.path.realpath(path, strict=True)
        except (OSError, RuntimeError) as e:
            raise PackageError(f"{where} is a link that loops or leads nowhere ({getattr(e, 'strerror', e)})") from None
        if os.path.commonpath([real, self.real_root]) != self.real_root:
            raise PackageError(f"{where} resolves outside the package (a link to {real})")
        try:
            target = os.stat(real)
        except OSError as e:
            raise PackageError(f"{where} is a link to {real}, which cannot be examined ({e.strerror})") from None
        if not stat.S_ISREG(target.st_mode):
            raise PackageError(f"{where} is a link to a {_kind(target.st_mode)}; a package holds only regular files")
        return real

    def size(self, name: str) -> int:
        fd, size = open_regular(self.files[name], f"{self.root}: part {name!r}")
        os.close(fd)
        return size

    def read(self, name: str) -> tuple[bytes, str]:
        return _read_regular(self.files[name], self.size(name), f"{self.root}: part {name!r}")

    def close(self) -> None:
        pass


def read(path: str | os.PathLike, limits: Limits | None = None) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every part it lists, each checked against its size and hash.

    Every size (the manifest's claim, the file system's or archive's, the limits) is checked for all parts
    before any part is read; each part is then read in chunks and hashed as it streams in."""
    path, limits = os.fspath(path), resolve(limits)
    try:
        st = os.stat(path)
    except OSError as e:
        raise PackageError(f"{path}: no such package" if isinstance(e, FileNotFoundError)
                           else f"{path}: cannot be examined ({e.strerror})") from None
    source = _Dir(path) if stat.S_ISDIR(st.st_mode) else _Zip(path, limits)
    try:
        if MANIFEST not in (source.files if isinstance(source, _Dir) else source.members):
            raise PackageError(f"{path}: no {MANIFEST}; this is not a StitchML package")
        present = set(source.files if isinstance(source, _Dir) else source.members)
        msize = source.size(MANIFEST)
        if msize > MAX_MANIFEST_BYTES:
            raise PackageError(f"{path}: {MANIFEST} is {msize} bytes, over {MAX_MANIFEST_BYTES}")
        manifest = parse_json(source.read(MANIFEST)[0], f"{path}: {MANIFEST}")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
            raise PackageError(f"{path}: {MANIFEST} must be an object with a 'parts' table")
        table = manifest["parts"]
        if len(table) > MAX_PARTS:
            raise PackageError(f"{path}: the manifest lists {len(table)} parts, more than {MAX_PARTS}")
        extra = present - set(table) - {MANIFEST}
        if extra:
            raise PackageError(f"{path}: files not listed in the manifest: {sorted(extra)[:5]}")
        total = 0
        for name, entry in table.items():
            where = f"{path}: manifest parts[{name!r}]"
            check_part_name(name, where)
            if not isinstance(entry, dict) or not is_int(entry.get("size")) or entry["size"] < 0 \
                    or not isinstance(entry.get("sha256"), str):
                raise PackageError(f"{where}: expected {{'size': int >= 0, 'sha256': hex}}, got {entry!r}"[:300])
            if name not in present:
                raise PackageError(f"{path}: part {name!r} is listed in the manifest but missing (truncated package?)")
            size = source.size(name)
            if size != entry["size"]:
                raise PackageError(f"{path}: part {name!r} is {size} bytes, the manifest says {entry['size']}")
            if size > limits.max_part_bytes:
                raise limits.exceeded("max_part_bytes", size, f"{path}: part {name!r}'s size in bytes")
            total += size
            if total > limits.max_package_bytes:
                raise limits.exceeded("max_package_bytes", total, f"{path}: the parts' total size in bytes")
        parts: dict[str, bytes] = {}
        for name, entry in table.items():
            data, digest = source.read(name)
            if digest != entry["sha256"]:
                raise PackageError(f"{path}: part {name!r} is corrupted: SHA-256 {digest[:16]}..., "
                                   f"the manifest says {str(entry['sha256'])[:16]}...")
            parts[name] = data
    finally:
        source.close()
    return manifest, parts
