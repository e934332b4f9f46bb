"""The engine's one little-endian helper (``arbiter_engine/byteorder.h``): it writes and reads the
bytes Python's ``struct`` does with ``<``, and no other file of the engine shifts bytes itself."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[3] / "arbiter_engine"
VALUES = (0, 1, 0x0102, 0xFFFF, 0x01020304, 0x80000001, 0xFFFFFFFF, 0x0102030405060708, 2**63 + 5, 2**64 - 1)

PROGRAM = r"""
#include "byteorder.h"
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
        uint8_t bytes[8];
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


def test_the_helpers_write_and_read_little_endian(tmp_path: Path) -> None:
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no gcc to compile the helpers with")
    source, program = tmp_path / "byteorder.c", tmp_path / "byteorder"
    source.write_text(PROGRAM)
    subprocess.run([compiler, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wconversion", f"-I{ENGINE}",
                    str(source), "-o", str(program)], check=True, timeout=60)
    output = subprocess.run([str(program), *map(str, VALUES)], check=True, capture_output=True, text=True,
                            timeout=10).stdout.splitlines()
    for value, line in zip(VALUES, output, strict=True):
        put16, put32, put64, get16, get32, get64 = line.split()
        assert [bytes.fromhex(put) for put in (put16, put32, put64)] == [
            struct.pack("<H", value & 0xFFFF), struct.pack("<I", value & 0xFFFFFFFF), struct.pack("<Q", value)]
        assert (int(get16), int(get32), int(get64)) == (value & 0xFFFF, value & 0xFFFFFFFF, value)


def test_no_other_file_of_the_engine_shifts_bytes() -> None:
    shifts = re.compile(r"<< (8|16|24)\b|>> (8|16|24)\b|\w*_le(16|32|64)?\s*\(")
    found = [f"{path.name}: {line.strip()}" for path in sorted(ENGINE.glob("*.[ch]")) if path.name != "byteorder.h"
             for line in path.read_text().splitlines()
             if (match := shifts.search(line)) and not match[0].startswith("fgs_")]
    assert found == []
