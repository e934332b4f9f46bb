"""Generates the simulated driver's answer for every driver entry point it does not implement.

Run by ``make -C simgpu`` (stdlib only). It reads:

- the ``PFN_cuXxx_vNNNN[_ptds|_ptsz]`` typedefs of the CUDA headers (``cudaTypedefs.h`` and the
  interop ``cuda*Typedefs.h`` beside it): each gives a base name, the CUDA version of one ABI and
  whether it is the per-thread default stream variant;
- ``entry_points_extra.txt``: entry points NVIDIA's cuda-bindings asks for that the headers lack;
- the ``proc_rows_*.def`` row files: the base names the driver implements (``ROW(base, ...)``).

and writes:

- a C file (no cuda.h) that defines every exported name of the driver API as a *weak* function
  ``int name(void)`` returning ``CUDA_ERROR_NOT_SUPPORTED`` (801), so that ``dlsym`` finds every
  name and the driver's own (strong) definitions replace the stubs at link time, plus the
  ``cuGetProcAddress`` rows (``fake_stub_rows``) of every base name no row file implements, and of
  the ABIs of an implemented base that are older than its oldest row (so that every version a
  header declares answers, if only with not-supported);
- a tab-separated list, one base name a line: base, ``implemented`` or ``not-supported``, its ABIs
  (``since[_ptds|_ptsz]``, comma-separated) and its exported names (comma-separated).

Exported names follow NVIDIA's rule, checked against cuda.h's internal declarations: a base's ABIs
sorted by version are ``base``, ``base_v2``, ``base_v3``...; its k per-thread ABIs are the newest k
of those names with ``_ptds``/``_ptsz`` appended (``cuMemcpyHtoD_v7000_ptds`` is
``cuMemcpyHtoD_v2_ptds``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

TYPEDEF = re.compile(r"PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)")
ROW = re.compile(r"^\s*ROW\(\s*(cu\w+)\s*,\s*(\d+)\s*,", re.MULTILINE)
EXTRA = re.compile(r"^(cu\w+)\s+(\d+)(?:\s+(ptds|ptsz))?$")
NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED


@dataclass
class EntryPoint:
    """One base name: its ABIs by per-thread suffix ('' for the default stream) and versions."""

    base: str
    abis: dict[str, set[int]] = field(default_factory=dict)

    def add(self, since: int, suffix: str) -> None:
        self.abis.setdefault(suffix, set()).add(since)

    def names(self) -> list[tuple[int, str, str]]:
        """(since, suffix, exported name) for every ABI, oldest first."""
        plain = sorted(self.abis.get("", set()))
        plain_names = [self.base if i == 0 else f"{self.base}_v{i + 1}" for i in range(len(plain))]
        out = list(zip(plain, [""] * len(plain), plain_names, strict=True))
        for suffix, versions in sorted(self.abis.items()):
            if not suffix:
                continue
            ordered = sorted(versions)
            stems = plain_names[-len(ordered):] if len(ordered) <= len(plain_names) else []
            if not stems:  # per-thread ABIs without as many plain ones: number them alike
                stems = [self.base if i == 0 else f"{self.base}_v{i + 1}" for i in range(len(ordered))]
            out.extend((since, suffix, stem + suffix) for since, stem in zip(ordered, stems, strict=True))
        return out


def read_headers(include: Path) -> dict[str, EntryPoint]:
    headers = sorted(include.glob("cuda*Typedefs.h"))
    if not any(h.name == "cudaTypedefs.h" for h in headers):
        raise SystemExit(f"gen_entry_points: no cudaTypedefs.h in {include} (it comes with cuda.h)")
    points: dict[str, EntryPoint] = {}
    for header in headers:
        for match in TYPEDEF.finditer(header.read_text(encoding="utf-8", errors="replace")):
            base, since, suffix = match.group(1), int(match.group(2)), match.group(3) or ""
            points.setdefault(base, EntryPoint(base)).add(since, suffix)
    return points


def read_extra(path: Path, points: dict[str, EntryPoint]) -> None:
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = EXTRA.match(line)
        if match is None:
            raise SystemExit(f"gen_entry_points: {path}:{number}: '{raw}' is not 'cuName VERSION [ptds|ptsz]'")
        base, since, suffix = match.group(1), int(match.group(2)), match.group(3)
        points.setdefault(base, EntryPoint(base)).add(since, f"_{suffix}" if suffix else "")


def read_implemented(row_files: list[Path]) -> dict[str, int]:
    """Each implemented base name and the oldest CUDA version its rows implement."""
    implemented: dict[str, int] = {}
    for path in row_files:
        for base, since in ROW.findall(path.read_text(encoding="utf-8")):
            implemented[base] = min(int(since), implemented.get(base, int(since)))
    return implemented


def stub_rows(point: EntryPoint, implemented: dict[str, int]) -> list[tuple[int, str, str]]:
    """The ABIs of a base that answer not-supported: all of them, or those older than its rows."""
    oldest = implemented.get(point.base)
    return [abi for abi in point.names() if oldest is None or abi[0] < oldest]


def c_source(points: dict[str, EntryPoint], implemented: dict[str, int], sources: str) -> str:
    names = sorted({name for point in points.values() for _, _, name in point.names()})
    rows = [
        f'    {{"{point.base}", {since}, {1 if suffix else 0}, (void *){name}}},'
        for point in sorted(points.values(), key=lambda p: p.base)
        for since, suffix, name in stub_rows(point, implemented)
    ]
    lines = [
        "/*",
        " * entry_stubs.c: GENERATED by simgpu/driver/gen_entry_points.py; do not edit.",
        f" * From {sources}.",
        " * Every exported name of the driver API as a weak int name(void) returning",
        f" * CUDA_ERROR_NOT_SUPPORTED ({NOT_SUPPORTED}): the driver's own definitions replace them at link time.",
        " * fake_stub_rows: the cuGetProcAddress rows of the base names no proc_rows_*.def implements,",
        " * and of the ABIs older than the oldest row of those it implements.",
        " */",
        '#include "proc_table.h"',
        "",
        "#define STUB(name) int name(void) __attribute__((weak)); int name(void) { return FAKE_NOT_SUPPORTED; }",
        "",
        *(f"STUB({name})" for name in names),
        "",
        "const struct proc_entry fake_stub_rows[] = {",
        *rows,
        "};",
        "const size_t fake_stub_row_count = sizeof fake_stub_rows / sizeof fake_stub_rows[0];",
        "",
    ]
    return "\n".join(lines)


def listing(points: dict[str, EntryPoint], implemented: dict[str, int]) -> str:
    lines = ["# base\tkind\tabis\texported names"]
    for point in sorted(points.values(), key=lambda p: p.base):
        entries = point.names()
        abis = ",".join(f"{since}{suffix}" for since, suffix, _ in entries)
        kind = "implemented" if point.base in implemented else "not-supported"
        lines.append(f"{point.base}\t{kind}\t{abis}\t{','.join(name for _, _, name in entries)}")
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", type=Path, required=True, help="the directory of cuda.h and cudaTypedefs.h")
    parser.add_argument("--extra", type=Path, required=True, help="entry_points_extra.txt")
    parser.add_argument("--c", type=Path, required=True, help="the C file to write")
    parser.add_argument("--list", type=Path, required=True, help="the list to write")
    parser.add_argument("rows", type=Path, nargs="+", help="the proc_rows_*.def files")
    args = parser.parse_args(argv)
    points = read_headers(args.include)
    read_extra(args.extra, points)
    implemented = read_implemented(args.rows)
    for base in implemented.keys() - points.keys():  # implemented, though the headers do not know it
        points[base] = EntryPoint(base)
    sources = f"{args.include}/cuda*Typedefs.h, {args.extra.name} and {', '.join(p.name for p in args.rows)}"
    write(args.c, c_source(points, implemented, sources))
    write(args.list, listing(points, implemented))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
