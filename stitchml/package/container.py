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
* a directory package may not reach outside itself through links.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from typing import Any

from ..errors import PackageError

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


def parse_json(data: bytes, what: str) -> Any:
    """JSON from untrusted bytes: UTF-8, bounded nesting, typed errors."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise PackageError(f"{what}: not valid UTF-8 JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise PackageError(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


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


def _read_zip(path: str) -> tuple[bytes, dict[str, zipfile.ZipInfo], zipfile.ZipFile]:
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise PackageError(f"{path}: not a readable package archive ({e})") from None
    infos = z.infolist()
    if len(infos) > MAX_PARTS + 1:
        raise PackageError(f"{path}: {len(infos)} members, more than the limit of {MAX_PARTS}")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        check_part_name(info.filename, path)
        if info.filename in members:
            raise PackageError(f"{path}: member {info.filename!r} appears twice")
        if info.compress_type != zipfile.ZIP_STORED:
            raise PackageError(f"{path}: member {info.filename!r} is compressed (method {info.compress_type}); "
                               "packages store members uncompressed")
        if info.flag_bits & 0x1:
            raise PackageError(f"{path}: member {info.filename!r} is encrypted")
        members[info.filename] = info
    claimed = sum(i.file_size for i in infos)
    if claimed > os.path.getsize(path):
        raise PackageError(f"{path}: members claim {claimed} bytes but the archive holds {os.path.getsize(path)} "
                           "(overlapping or forged members)")
    if MANIFEST not in members:
        raise PackageError(f"{path}: no {MANIFEST}; this is not a StitchML package")
    if members[MANIFEST].file_size > MAX_MANIFEST_BYTES:
        raise PackageError(f"{path}: {MANIFEST} is {members[MANIFEST].file_size} bytes, over {MAX_MANIFEST_BYTES}")
    return _zip_bytes(z, members[MANIFEST], path), members, z


def _zip_bytes(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> bytes:
    try:
        with z.open(info) as f:
            data = f.read(info.file_size + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as e:
        raise PackageError(f"{path}: member {info.filename!r} is damaged ({e})") from None
    if len(data) != info.file_size:
        raise PackageError(f"{path}: member {info.filename!r} holds {len(data)} bytes, its header says {info.file_size}")
    return data


def _dir_file(root: str, name: str) -> str:
    target = os.path.join(root, *name.split("/"))
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(target), real_root]) != real_root:
        raise PackageError(f"{root}: part {name!r} resolves outside the package (a link)")
    return target


def _dir_listing(root: str) -> set[str]:
    found = set()
    for base, dirs, files in os.walk(root):
        for f in files:
            found.add(os.path.relpath(os.path.join(base, f), root).replace(os.sep, "/"))
        if len(found) > MAX_PARTS + 1:
            raise PackageError(f"{root}: more than {MAX_PARTS} files")
    return found


def read(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every part it lists, each checked against its size and hash."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise PackageError(f"{path}: no such package")
    if os.path.isdir(path):
        mpath = _dir_file(path, MANIFEST)
        if not os.path.isfile(mpath):
            raise PackageError(f"{path}: no {MANIFEST}; this is not a StitchML package")
        if os.path.getsize(mpath) > MAX_MANIFEST_BYTES:
            raise PackageError(f"{path}: {MANIFEST} is over {MAX_MANIFEST_BYTES} bytes")
        with open(mpath, "rb") as f:
            raw_manifest = f.read()
        present, z, members = _dir_listing(path), None, {}
    else:
        raw_manifest, members, z = _read_zip(path)
        present = set(members)
    manifest = parse_json(raw_manifest, f"{path}: {MANIFEST}")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), dict):
        raise PackageError(f"{path}: {MANIFEST} must be an object with a 'parts' table")
    table = manifest["parts"]
    if len(table) > MAX_PARTS:
        raise PackageError(f"{path}: the manifest lists {len(table)} parts, more than {MAX_PARTS}")
    extra = present - set(table) - {MANIFEST}
    if extra:
        raise PackageError(f"{path}: files not listed in the manifest: {sorted(extra)[:5]}")
    parts: dict[str, bytes] = {}
    try:
        for name, entry in table.items():
            where = f"{path}: manifest parts[{name!r}]"
            check_part_name(name, where)
            if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or entry["size"] < 0 \
                    or not isinstance(entry.get("sha256"), str):
                raise PackageError(f"{where}: expected {{'size': int >= 0, 'sha256': hex}}, got {entry!r}"[:300])
            if name not in present:
                raise PackageError(f"{path}: part {name!r} is listed in the manifest but missing (truncated package?)")
            if z is not None:
                info = members[name]
                if info.file_size != entry["size"]:
                    raise PackageError(f"{path}: part {name!r} is {info.file_size} bytes, the manifest says {entry['size']}")
                data = _zip_bytes(z, info, path)
            else:
                fpath = _dir_file(path, name)
                size = os.path.getsize(fpath)
                if size != entry["size"]:
                    raise PackageError(f"{path}: part {name!r} is {size} bytes, the manifest says {entry['size']}")
                with open(fpath, "rb") as f:
                    data = f.read(entry["size"] + 1)
            digest = sha256(data)
            if digest != entry["sha256"]:
                raise PackageError(f"{path}: part {name!r} is corrupted: SHA-256 {digest[:16]}..., "
                                   f"the manifest says {str(entry['sha256'])[:16]}...")
            parts[name] = data
    finally:
        if z is not None:
            z.close()
    return manifest, parts
