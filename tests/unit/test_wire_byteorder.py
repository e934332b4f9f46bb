"""The wire's one little-endian helper in C (``vgpu_hook/include/fastgshare_byteorder.h``).

It writes and reads the bytes Python's ``struct`` does with ``<``; and no other C file of the
engine, the hook, the hook's tools or the bench encodes or decodes little-endian integers itself
(byte-sized shifts, hand-written ``get_le``/``put_u32``-style helpers, ``endian.h`` conversions).

Shifts that are not byte order stay allowed, and the pattern does not match them: the engine's
connection ids (``generation << 32 | slot``), sizes (``1 << 20``), the allocation table's hash
(``x >> 30``) and mipmap levels (``dim >> level``). No file is excepted today; ``EXCEPTIONS``
names any that must be, with the reason.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "vgpu_hook" / "include" / "fastgshare_byteorder.h"
SCANNED = ("arbiter_engine", "vgpu_hook/include", "vgpu_hook/src", "vgpu_hook/tests", "bench")
EXCEPTIONS: dict[str, str] = {}  # path from the root -> why it may shift wire bytes itself
VALUES = (0, 1, 0x0102, 0xFFFF, 0x01020304, 0x80000001, 0xFFFFFFFF, 0x0102030405060708, 2**63 + 5, 2**64 - 1)

# A variable (not a number: 1ULL << 16 is a size) shifted by a whole byte (8, 16, 24, or 8 * i in a
# loop); a private helper named like get_le, put_le32, get_u16 or put_u64 (the helper's own fgs_
# names are allowed); endian.h and byteswap.h conversions.
HAND_ROLLED = re.compile(r"(\b[A-Za-z_]\w*(\[[^]]*\])?|\))\s*(<<|>>)\s*\(?\s*(8|16|24)\b"
                         r"|\b(?!fgs_)\w*(get|put)_(le|u)(16|32|64)?\s*\("
                         r"|\b(htole|le)(16|32|64)(toh)?\s*\(|\bbswap_(16|32|64)\b|__builtin_bswap")

PROGRAM = r"""
#include "fastgshare_byteorder.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static void print_bytes(const uint8_t *bytes, int count)
{
    for (int k = 0; k < count; k++)
        printf("%02x", bytes[k]);
    printf(" ");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        uint64_t value = strtoull(argv[i], NULL, 10);
        uint8_t buffer[9];
        uint8_t *bytes = buffer + 1; /* odd address: the helper must not need alignment */
        fgs_put_le16(bytes, (uint16_t)value);
        print_bytes(bytes, 2);
        fgs_put_le32(bytes, (uint32_t)value);
        print_bytes(bytes, 4);
        fgs_put_le64(bytes, value);
        print_bytes(bytes, 8);
        printf("%" PRIu16 " %" PRIu32 " %" PRIu64 "\n", fgs_get_le16(bytes), fgs_get_le32(bytes), fgs_get_le64(bytes));
    }
    return 0;
}
"""


def hand_rolled(text: str) -> list[str]:
    """The lines of C ``text`` that encode or decode little-endian integers without the helper."""
    return [line.strip() for line in text.splitlines() if HAND_ROLLED.search(line)]


def test_the_helper_writes_and_reads_little_endian(tmp_path: Path) -> None:
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no gcc to compile the helper with")
    source, program = tmp_path / "byteorder.c", tmp_path / "byteorder"
    source.write_text(PROGRAM)
    subprocess.run([compiler, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wconversion", "-Wcast-align",
                    f"-I{HELPER.parent}", str(source), "-o", str(program)], check=True, timeout=60)
    output = subprocess.run([str(program), *map(str, VALUES)], check=True, capture_output=True, text=True,
                            timeout=10).stdout.splitlines()
    for value, line in zip(VALUES, output, strict=True):
        put16, put32, put64, get16, get32, get64 = line.split()
        assert [bytes.fromhex(put) for put in (put16, put32, put64)] == [
            struct.pack("<H", value & 0xFFFF), struct.pack("<I", value & 0xFFFFFFFF), struct.pack("<Q", value)]
        assert (int(get16), int(get32), int(get64)) == (value & 0xFFFF, value & 0xFFFFFFFF, value)


@pytest.mark.parametrize("line", [
    "p[1] = (uint8_t)(v >> 8);",
    "p[i] = (uint8_t)(v >> (8 * i));",
    "v = (v << 8) | p[i];",
    "return (uint16_t)(p[0] | (p[1] << 8));",
    "return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;",
    "static void put_le(uint8_t *p, uint64_t v, int n)",
    "uint32_t length = (uint32_t)get_le(c->in + at, 4);",
    "put_u32(frame + 8, id);",
    "*pod_used = get_u64(body + 4);",
    "uint32_t n = le32toh(raw);",
    "uint16_t x = htole16(v);",
    "return __builtin_bswap32(v);",
])
def test_hand_rolled_byte_order_is_recognised(line: str) -> None:
    assert hand_rolled(line) == [line]


@pytest.mark.parametrize("line", [
    "uint32_t slot = (uint32_t)id, generation = (uint32_t)(id >> 32);",
    "c->id = (uint64_t)e->generations[slot] << 32 | (uint32_t)slot;",
    "#define MAX_REQUEST (64u << 20)",
    "x ^= x >> 30;",
    "uint64_t v = level < 64 ? dim >> level : 0;",
    "fgs_quota_grant(&q, (uint64_t)1 << 40);",
    "kernel_ms(g, o, 1ULL << 16);",
    "size_t chunk = (size_t)1 << 16;",
    "uint32_t length = fgs_get_le32(frame);",
    "fgs_put_le64(payload, value);",
    "if (cycle_len(x) > 8)",
])
def test_other_shifts_and_the_helper_are_not_flagged(line: str) -> None:
    assert hand_rolled(line) == []


def test_no_other_c_file_shifts_wire_bytes() -> None:
    files = sorted(path for folder in SCANNED for path in (ROOT / folder).rglob("*.[ch]") if path != HELPER)
    assert any(path.name == "arbiter_client.c" for path in files), "the scan found none of the hook's sources"
    found = [f"{path.relative_to(ROOT)}: {line}" for path in files
             if str(path.relative_to(ROOT)) not in EXCEPTIONS for line in hand_rolled(path.read_text())]
    assert found == []
