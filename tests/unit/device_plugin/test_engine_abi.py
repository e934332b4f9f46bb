"""The engine's ABI (``arbiter_engine/engine_abi.h``) and its ctypes mirror
(``device_plugin/arbiter/native.py``: ``ABI_FUNCTIONS``, ``ABI_STRUCTS``, ``ABI_CONSTANTS``) cannot drift:

- every function the header declares is mirrored, and no other, with its return and argument types;
- every struct is mirrored with the same fields in the same order, each of the mirrored type, at the
  offset and of the size the C compiler gives (a program compiled here prints ``offsetof``/``sizeof``),
  and the same total size;
- every constant (``#define FGS_*``, enum members) has the compiler's value;
- the built library exports no ``fgs_*`` function the header does not declare (one header, no other ABI).

The header is read by the small parser below. It knows only the declarations the header is written
in, and refuses anything else with the declaration quoted, so the header's style stays regular:
``#define FGS_NAME value``; ``typedef struct name name;`` (opaque); ``typedef struct name { type
field; type field[count]; } name;``; ``enum name { FGS_A = 1, ... };``; ``_Static_assert(...);`` and
``type name(type arg, ...);``, where a type is a base (a fixed-width integer, ``bool``, ``char``,
``void`` or an ``fgs_*`` typedef), with ``const`` and pointers.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import cast

import attrs
import pytest

from device_plugin.arbiter import native

ROOT = Path(__file__).resolve().parents[3]
HEADER = ROOT / "arbiter_engine" / "engine_abi.h"

SCALARS: dict[str, object] = {
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "uint8_t": ctypes.c_uint8, "bool": ctypes.c_bool, "char": ctypes.c_char,
}
BYTE_POINTERS: dict[str, tuple[object, ...]] = {
    "char": (ctypes.c_char_p,), "uint8_t": (ctypes.POINTER(ctypes.c_uint8), ctypes.c_char_p),
}


@attrs.frozen
class CType:
    base: str
    pointers: int = 0

    def __str__(self) -> str:
        return self.base + " *" * self.pointers


@attrs.frozen
class Field:
    name: str
    type: CType
    array: bool


@attrs.frozen
class Function:
    returns: CType
    params: tuple[CType, ...]


@attrs.frozen
class Header:
    constants: tuple[str, ...]
    opaque: frozenset[str]
    structs: dict[str, tuple[Field, ...]]
    functions: dict[str, Function]


def _type(text: str) -> CType:
    words = text.replace("*", " * ").replace("const", " ").split()
    bases = [word for word in words if word != "*"]
    if len(bases) != 1 or not re.fullmatch(r"\w+", bases[0]):
        raise ValueError(f"engine_abi.h: a type the parser does not know: {text!r}")
    return CType(bases[0], words.count("*"))


def _params(text: str) -> tuple[CType, ...]:
    if text.strip() == "void":
        return ()
    params = []
    for param in text.split(","):
        match = re.fullmatch(r"(.+?)\b\w+", param.strip())
        if match is None:
            raise ValueError(f"engine_abi.h: a parameter the parser does not know: {param!r}")
        params.append(_type(match[1]))
    return tuple(params)


def _fields(body: str) -> tuple[Field, ...]:
    fields = []
    for field in filter(None, (part.strip() for part in body.split(";"))):
        match = re.fullmatch(r"(.+?)\b(\w+)\s*(\[[^\]]+\])?", field)
        if match is None:
            raise ValueError(f"engine_abi.h: a field the parser does not know: {field!r}")
        fields.append(Field(match[2], _type(match[1]), match[3] is not None))
    return tuple(fields)


def _declarations(code: str) -> list[str]:
    """The top-level declarations, each ending at a ';' outside braces, on one line each."""
    declarations, depth, start = [], 0, 0
    for index, char in enumerate(code):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == ";" and depth == 0:
            declarations.append(" ".join(code[start:index].split()))
            start = index + 1
    if code[start:].strip():
        raise ValueError(f"engine_abi.h: text after the last declaration: {code[start:].strip()!r}")
    return [declaration for declaration in declarations if declaration]


def parse_header(text: str) -> Header:
    text = re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))
    # A #define with a value (the include guard has none).
    constants = re.findall(r"^[ \t]*#[ \t]*define[ \t]+(FGS_\w+)[ \t]+\S", text, flags=re.M)
    code = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    opaque, structs, functions = set(), {}, {}
    for declaration in _declarations(code):
        if match := re.fullmatch(r"typedef struct (\w+) \1", declaration):
            opaque.add(match[1])
        elif match := re.fullmatch(r"typedef struct (\w+) \{(.*)\} \1", declaration):
            structs[match[1]] = _fields(match[2])
        elif match := re.fullmatch(r"enum \w+ \{(.*)\}", declaration):
            constants += [member.split("=")[0].strip() for member in match[1].split(",") if member.strip()]
        elif declaration.startswith("_Static_assert("):
            continue
        elif match := re.fullmatch(r"(.+?)\b(\w+)\((.*)\)", declaration):
            functions[match[2]] = Function(_type(match[1]), _params(match[3]))
        else:
            raise ValueError(f"engine_abi.h: a declaration the parser does not know: {declaration!r}")
    return Header(tuple(constants), frozenset(opaque), structs, functions)


def expected(ctype: CType, header: Header, mirrors: dict[str, type[ctypes.Structure]]) -> tuple[object, ...]:
    """The ctypes types that mirror a C type: exactly one, except that a byte pointer (``uint8_t *``)
    may also be passed as ``c_char_p`` (Python's bytes and string buffers)."""
    base, pointers = ctype.base, ctype.pointers
    if pointers == 0 and (base in SCALARS or base in mirrors or base == "void"):
        return (SCALARS.get(base, mirrors.get(base)),)
    if pointers == 1 and base in header.opaque:
        return (ctypes.c_void_p,)
    if pointers == 1 and base in BYTE_POINTERS:
        return BYTE_POINTERS[base]
    if pointers > 0:
        inner = expected(CType(base, pointers - 1), header, mirrors)
        return tuple(ctypes.POINTER(cast("type[ctypes.c_int]", element)) for element in inner if element is not None)
    raise ValueError(f"engine_abi.h: no ctypes mirror for {ctype}")


def _name(ctypes_type: object) -> str:
    return "None" if ctypes_type is None else getattr(ctypes_type, "__name__", repr(ctypes_type))


def _missing(declared: set[str], mirrored: set[str]) -> list[str]:
    return ([f"{name}: declared in engine_abi.h, not mirrored" for name in sorted(declared - mirrored)]
            + [f"{name}: mirrored, not declared in engine_abi.h" for name in sorted(mirrored - declared)])


def function_drift(header: Header, functions: dict[str, tuple[object, tuple[object, ...]]],
                   mirrors: dict[str, type[ctypes.Structure]]) -> list[str]:
    problems = _missing(set(header.functions), set(functions))
    for name in sorted(set(header.functions) & set(functions)):
        declared, (restype, argtypes) = header.functions[name], functions[name]
        if restype not in expected(declared.returns, header, mirrors):
            problems.append(f"{name}: returns {_name(restype)}, the header says {declared.returns}")
        if len(argtypes) != len(declared.params):
            problems.append(f"{name}: {len(argtypes)} arguments, the header has {len(declared.params)}")
        for position, (argtype, param) in enumerate(zip(argtypes, declared.params, strict=False)):
            if argtype not in expected(param, header, mirrors):
                problems.append(f"{name}: argument {position} is {_name(argtype)}, the header says {param}")
    return problems


def struct_drift(header: Header, layout: dict[str, int], mirrors: dict[str, type[ctypes.Structure]]) -> list[str]:
    """``layout``: what the compiled program printed, e.g. ``{"fgs_share": 12, "fgs_share.sm_percent": 8,
    "fgs_share.sm_percent/size": 4}``."""
    problems = _missing(set(header.structs), set(mirrors))
    for name in sorted(set(header.structs) & set(mirrors)):
        fields, mirror = header.structs[name], mirrors[name]
        mirrored = [(field[0], field[1]) for field in mirror._fields_]
        if [field.name for field in fields] != [field_name for field_name, _ in mirrored]:
            problems.append(f"{name}: fields {[field_name for field_name, _ in mirrored]}, the header has "
                            f"{[field.name for field in fields]}")
            continue
        if ctypes.sizeof(mirror) != layout[name]:
            problems.append(f"{name}: {ctypes.sizeof(mirror)} bytes, the compiler says {layout[name]}")
        for field, (_, field_type) in zip(fields, mirrored, strict=True):
            element = getattr(field_type, "_type_", None) if field.array else field_type
            if (field.array and not issubclass(field_type, ctypes.Array)) or element not in expected(
                    field.type, header, mirrors):
                problems.append(f"{name}.{field.name}: {_name(field_type)}, the header says {field.type}"
                                f"{'[]' if field.array else ''}")
            offset, size = getattr(mirror, field.name).offset, ctypes.sizeof(field_type)
            if (offset, size) != (layout[f"{name}.{field.name}"], layout[f"{name}.{field.name}/size"]):
                problems.append(f"{name}.{field.name}: offset {offset} size {size}, the compiler says "
                                f"{layout[f'{name}.{field.name}']} and {layout[f'{name}.{field.name}/size']}")
    return problems


def compiled_layout(header: Header, tmp_path: Path) -> dict[str, int]:
    """Each struct's size, each field's offset and size, and each constant, as gcc compiles the header."""
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no gcc to compile the header with")
    lines = ["#include \"engine_abi.h\"", "#include <stddef.h>", "#include <stdio.h>", "int main(void)", "{"]
    for name, fields in header.structs.items():
        lines.append(f'    printf("{name} %zu\\n", sizeof({name}));')
        for field in fields:
            lines.append(f'    printf("{name}.{field.name} %zu\\n", offsetof({name}, {field.name}));')
            lines.append(f'    printf("{name}.{field.name}/size %zu\\n", sizeof((({name} *)0)->{field.name}));')
    for constant in header.constants:
        lines.append(f'    printf("{constant} %lld\\n", (long long)({constant}));')
    lines += ["    return 0;", "}"]
    source, program = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text("\n".join(lines) + "\n")
    # Only arbiter_engine/ on the include path: the ABI header stands alone.
    subprocess.run([compiler, "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{HEADER.parent}", str(source), "-o",
                    str(program)], check=True, timeout=60)
    output = subprocess.run([str(program)], check=True, capture_output=True, text=True, timeout=10).stdout
    return {key: int(value) for key, value in (line.split() for line in output.splitlines())}


@pytest.fixture(scope="module")
def header() -> Header:
    return parse_header(HEADER.read_text())


def test_every_function_is_mirrored_with_the_headers_types(header: Header) -> None:
    assert len(header.functions) >= 30  # the parser found the declarations
    assert function_drift(header, native.ABI_FUNCTIONS, native.ABI_STRUCTS) == []


def test_every_struct_is_mirrored_with_the_compilers_layout(header: Header, tmp_path: Path) -> None:
    assert {"fgs_share", "fgs_grant", "fgs_event", "fgs_pod_usage"} <= set(header.structs)
    assert struct_drift(header, compiled_layout(header, tmp_path), native.ABI_STRUCTS) == []


def test_every_constant_has_the_compilers_value(header: Header, tmp_path: Path) -> None:
    layout = compiled_layout(header, tmp_path)
    assert set(native.ABI_CONSTANTS) == set(header.constants)
    assert {name: layout[name] for name in header.constants} == native.ABI_CONSTANTS


def test_the_library_exports_only_what_the_header_declares(header: Header) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm to list the library's symbols")
    listing = subprocess.run([nm, "-D", "--defined-only", native.library_path()], check=True, capture_output=True,
                             text=True, timeout=30).stdout
    exported = {line.split()[-1] for line in listing.splitlines() if line.split()[-1].startswith("fgs_")}
    assert exported == set(header.functions)


def test_a_drifted_function_is_caught(header: Header) -> None:
    functions = dict(native.ABI_FUNCTIONS)
    restype, argtypes = functions["fgs_engine_token"]
    functions["fgs_engine_token"] = (restype, (*argtypes[:2], ctypes.c_int32, *argtypes[3:]))  # request_id: signed
    del functions["fgs_engine_close"]
    assert function_drift(header, functions, native.ABI_STRUCTS) == [
        "fgs_engine_close: declared in engine_abi.h, not mirrored",
        "fgs_engine_token: argument 2 is c_int, the header says uint32_t"]


def test_a_drifted_struct_is_caught(header: Header, tmp_path: Path) -> None:
    layout = compiled_layout(header, tmp_path)

    class Swapped(ctypes.Structure):
        _fields_ = [("connection", ctypes.c_uint64), ("pid", ctypes.c_int32), ("kind", ctypes.c_int32),
                    ("length", ctypes.c_uint32)]

    class Narrow(ctypes.Structure):
        _fields_ = [("request_permille", ctypes.c_int32), ("limit_permille", ctypes.c_int32),
                    ("sm_percent", ctypes.c_int16)]

    mirrors: dict[str, type[ctypes.Structure]] = {**native.ABI_STRUCTS, "fgs_event": Swapped, "fgs_share": Narrow}
    problems = struct_drift(header, layout, mirrors)
    # The swapped fields by name; the narrow one by type, and by size (the struct's padding hides it in the total).
    assert [problem.split(":")[0] for problem in problems] == ["fgs_event", "fgs_share.sm_percent",
                                                                 "fgs_share.sm_percent"]


def test_the_parser_reads_the_headers_forms_and_refuses_others() -> None:
    parsed = parse_header("""
        #define FGS_X 3 /* a comment; with a semicolon */
        typedef struct fgs_thing fgs_thing;
        typedef struct fgs_pair { int64_t a; char name[FGS_X + 1]; } fgs_pair;
        enum fgs_kind { FGS_A = 1, FGS_B = 2 };
        const fgs_pair *fgs_make(fgs_thing *thing,
                                 const fgs_pair **out, uint32_t count);
        void fgs_none(void);
    """)
    assert parsed.constants == ("FGS_X", "FGS_A", "FGS_B")
    assert parsed.opaque == {"fgs_thing"}
    assert parsed.structs == {"fgs_pair": (Field("a", CType("int64_t"), array=False),
                                           Field("name", CType("char"), array=True))}
    assert parsed.functions == {
        "fgs_make": Function(CType("fgs_pair", 1), (CType("fgs_thing", 1), CType("fgs_pair", 2), CType("uint32_t"))),
        "fgs_none": Function(CType("void"), ())}
    with pytest.raises(ValueError, match="a declaration the parser does not know: 'int fgs_table\\[4\\]'"):
        parse_header("int fgs_table[4];")
    with pytest.raises(ValueError, match="a type the parser does not know: 'unsigned long '"):
        parse_header("unsigned long fgs_f(void);")
