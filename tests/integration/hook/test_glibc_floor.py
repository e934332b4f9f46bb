"""The glibc floor: every library mounted into containers loads on glibc 2.17 and newer.

The hook and the simulated ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (``make -C vgpu_hook``, which
builds ``simgpu`` first) are read with ``readelf`` (binutils, there wherever gcc is):

* no version need above ``GLIBC_2.17``;
* every version need ``(file, version)`` names a version node that file defines in glibc 2.17
  (the dynamic loader refuses the library otherwise: "version `GLIBC_2.34' not found");
* every versioned symbol the library imports is exported under that version by one of glibc 2.17's
  libraries that the library lists as ``DT_NEEDED``. The loader binds a versioned reference to any
  loaded object defining that name and version (glibc's ``elf/dl-lookup.c``, ``check_match``), so
  ``dlopen@GLIBC_2.2.5`` recorded under ``libc.so.6`` is found in ``libdl.so.2`` on glibc 2.17 as
  long as ``libdl.so.2`` is loaded, which only ``DT_NEEDED`` guarantees.

glibc 2.17's exports are its x86_64 ABI lists, recorded in ``glibc_2_17/`` (each file names the
release commit it comes from). They are x86_64's, so the last two checks run on x86_64 only.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.hook.tenants import BUILD, SIMGPU_BUILD, make_hook

ABI_LISTS = Path(__file__).resolve().parent / "glibc_2_17"
FLOOR = (2, 17)
# glibc 2.17's libraries (soname -> its ABI list in glibc_2_17/)
GLIBC_FILES = {"libc.so.6": "libc", "libpthread.so.0": "libpthread", "libdl.so.2": "libdl",
               "ld-linux-x86-64.so.2": "ld"}
LIBRARIES = {"hook": BUILD / "libfastgshare-hook.so", "libcuda.so.1": SIMGPU_BUILD / "libcuda.so.1",
             "libnvidia-ml.so.1": SIMGPU_BUILD / "libnvidia-ml.so.1"}

_NEED_FILE = re.compile(r"^\s*(?:0x)?[0-9a-f]+:\s+Version: \d+\s+File: (\S+)\s+Cnt: \d+")
_NEED_NAME = re.compile(r"^\s*(?:0x)?[0-9a-f]+:\s+Name: (\S+)\s+Flags: \S+\s+Version: (\d+)")
_UNDEFINED = re.compile(r"^\s*\d+: [0-9a-f]+\s+\d+\s+\S+\s+(\S+)\s+\S+\s+UND (\S+)@(\S+) \((\d+)\)")
_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[(.+)\]")


@dataclass(frozen=True)
class Import:
    """One versioned symbol a library imports, and the file its version need is recorded under."""

    name: str
    version: str
    file: str
    weak: bool


@dataclass(frozen=True)
class DynamicImports:
    """What a shared library asks of the C library: DT_NEEDED, version needs, versioned imports."""

    needed: tuple[str, ...]
    needs: frozenset[tuple[str, str]]  # (file, version)
    imports: tuple[Import, ...]


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "--wide", *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def read_imports(library: Path) -> DynamicImports:
    """Parses ``readelf -d``, ``-V`` and ``--dyn-syms`` of ``library``."""
    needed = tuple(_NEEDED.findall(_readelf("-d", str(library))))
    by_index: dict[str, tuple[str, str]] = {}
    current = ""
    in_needs = False
    for line in _readelf("-V", str(library)).splitlines():
        if line.startswith("Version needs section"):
            in_needs = True
        elif line.startswith("Version") and "section" in line:
            in_needs = False
        elif in_needs and (match := _NEED_FILE.match(line)):
            current = match.group(1)
        elif in_needs and (match := _NEED_NAME.match(line)):
            by_index[match.group(2)] = (current, match.group(1))
    imports = []
    for line in _readelf("--dyn-syms", str(library)).splitlines():
        if match := _UNDEFINED.match(line):
            bind, name, version, index = match.groups()
            file, need = by_index[index]
            assert need == version, f"readelf disagrees with itself on {name}: {version} vs {need}"
            imports.append(Import(name, version, file, bind == "WEAK"))
    return DynamicImports(needed, frozenset(by_index.values()), tuple(imports))


def version_tuple(version: str) -> tuple[int, ...]:
    """``GLIBC_2.3.4`` -> (2, 3, 4); anything else (``GLIBC_PRIVATE``) sorts above every release."""
    match = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else (99,)


def load_abi_list(file: str) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """One of glibc 2.17's ABI lists: (its version nodes, its (symbol, version) exports)."""
    nodes: set[str] = set()
    exports: set[tuple[str, str]] = set()
    version = ""
    for line in (ABI_LISTS / f"{GLIBC_FILES[file]}.abilist").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not line.startswith(" "):
            version = line.strip()
            continue
        name, kind = line.split()[:2]
        if kind == "A":
            nodes.add(name)
        else:
            exports.add((name, version))
    return frozenset(nodes), frozenset(exports)


def versions_above_floor(imports: DynamicImports) -> list[str]:
    """``name@version`` of every import, and every bare version need, above GLIBC_2.17."""
    late = sorted(f"{i.name}@{i.version}" for i in imports.imports
                  if i.version.startswith("GLIBC_") and version_tuple(i.version) > FLOOR)
    late += sorted(f"{file}: {version}" for file, version in imports.needs
                   if version.startswith("GLIBC_") and version_tuple(version) > FLOOR)
    return late


def needs_old_glibc_lacks(imports: DynamicImports) -> list[str]:
    """Version needs whose file is not one of glibc 2.17's or does not define that version there."""
    wrong = []
    for file, version in sorted(imports.needs):
        if not version.startswith("GLIBC_"):
            continue
        if file not in GLIBC_FILES:
            wrong.append(f"{version} is needed from {file}, which is not one of glibc's libraries")
        elif version not in load_abi_list(file)[0]:
            wrong.append(f"{version} is needed from {file}, which glibc 2.17's {file} does not define")
    return wrong


def imports_old_glibc_lacks(imports: DynamicImports) -> list[str]:
    """Non-weak imports that no DT_NEEDED library of glibc 2.17 exports under that version."""
    exports = {file: load_abi_list(file)[1] for file in GLIBC_FILES if file in imports.needed}
    wrong = []
    for item in imports.imports:
        if item.weak or not item.version.startswith("GLIBC_"):
            continue
        if any((item.name, item.version) in symbols for symbols in exports.values()):
            continue
        owners = [file for file in GLIBC_FILES if (item.name, item.version) in load_abi_list(file)[1]]
        where = (f"glibc 2.17 exports it from {', '.join(owners)}, not in DT_NEEDED {list(imports.needed)}"
                 if owners else "glibc 2.17 does not export it")
        wrong.append(f"{item.name}@{item.version}: {where}")
    return wrong


@pytest.fixture(scope="module")
def built() -> dict[str, DynamicImports]:
    make_hook()
    return {label: read_imports(path) for label, path in LIBRARIES.items()}


@pytest.mark.parametrize("label", sorted(LIBRARIES))
def test_no_glibc_version_above_2_17(built: dict[str, DynamicImports], label: str) -> None:
    imports = built[label]
    assert imports.imports, f"{label}: readelf listed no versioned import: the parser is broken"
    assert versions_above_floor(imports) == [], f"{label} needs glibc newer than 2.17"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="glibc_2_17/ holds x86_64's ABI lists only")
@pytest.mark.parametrize("label", sorted(LIBRARIES))
def test_every_version_need_is_met_by_glibc_2_17(built: dict[str, DynamicImports], label: str) -> None:
    assert needs_old_glibc_lacks(built[label]) == []


@pytest.mark.skipif(platform.machine() != "x86_64", reason="glibc_2_17/ holds x86_64's ABI lists only")
@pytest.mark.parametrize("label", sorted(LIBRARIES))
def test_every_import_is_exported_by_a_needed_glibc_2_17_library(built: dict[str, DynamicImports],
                                                                 label: str) -> None:
    assert imports_old_glibc_lacks(built[label]) == []


def test_the_checks_catch_what_a_glibc_2_36_build_binds() -> None:
    """What an unpinned build on glibc 2.34+ records: each check names what an old glibc lacks."""
    imports = DynamicImports(
        needed=("libc.so.6",),
        needs=frozenset({("libc.so.6", "GLIBC_2.34"), ("libc.so.6", "GLIBC_2.2.5")}),
        imports=(Import("dlopen", "GLIBC_2.34", "libc.so.6", False),
                 Import("pthread_create", "GLIBC_2.2.5", "libc.so.6", False),
                 Import("malloc", "GLIBC_2.2.5", "libc.so.6", False)))
    assert versions_above_floor(imports) == ["dlopen@GLIBC_2.34", "libc.so.6: GLIBC_2.34"]
    assert needs_old_glibc_lacks(imports) == [
        "GLIBC_2.34 is needed from libc.so.6, which glibc 2.17's libc.so.6 does not define"]
    assert imports_old_glibc_lacks(imports) == [
        "dlopen@GLIBC_2.34: glibc 2.17 does not export it",
        "pthread_create@GLIBC_2.2.5: glibc 2.17 exports it from libpthread.so.0, not in DT_NEEDED ['libc.so.6']"]
