"""Writes the kube-scheduler configuration schemas that test_scheduler_config_schemas.py checks against.

This module owns the translation of kube-scheduler's published configuration types (Go structs)
into the JSON schemas under ``tests/unit/deploy/kube_scheduler_config_schemas/``: one file per
(Kubernetes minor, API version) that minor's kube-scheduler serves, e.g. ``1.25-v1beta2.json``.

Where the types come from, per Kubernetes minor 1.N (the newest ``v0.N.P`` tag of each repository):

- ``k8s.io/kube-scheduler/config/<version>/*.go`` (github.com/kubernetes/kube-scheduler): the
  ``KubeSchedulerConfiguration`` struct and everything it reaches, the kinds ``register.go``
  registers (a version that does not register ``KubeSchedulerConfiguration``, such as the old
  ``Policy``-only ``v1`` of 1.20-1.22, is not served), and the plugin argument kinds;
- ``k8s.io/component-base/config/v1alpha1/*.go`` (github.com/kubernetes/component-base): the
  leader-election, client-connection and debugging structs the configuration embeds;
- two apimachinery types, written here from their documented JSON form: ``metav1.TypeMeta``
  (``apiVersion``, ``kind``) and ``metav1.Duration`` (a string Go's ``time.ParseDuration`` reads);
  ``runtime.RawExtension`` (plugin args) is any value.

Run it against git clones that have the release tags (a bare clone is enough)::

    git clone --bare https://github.com/kubernetes/kube-scheduler /tmp/kube-scheduler.git
    git clone --bare https://github.com/kubernetes/component-base /tmp/component-base.git
    .venv/bin/python -m tests.unit.deploy.generate_scheduler_config_schemas \\
        --kube-scheduler-git /tmp/kube-scheduler.git --component-base-git /tmp/component-base.git

A Go type it does not know stops it with one line naming the type: it never writes a schema that
would accept what kube-scheduler refuses because of a type it skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).with_name("kube_scheduler_config_schemas")
KUBE_SCHEDULER_REPO = "https://github.com/kubernetes/kube-scheduler"
COMPONENT_BASE_REPO = "https://github.com/kubernetes/component-base"
KUBE_SCHEDULER_IMPORT = "k8s.io/kube-scheduler/config/"
COMPONENT_BASE_IMPORT = "k8s.io/component-base/config/v1alpha1"
METAV1_IMPORT = "k8s.io/apimachinery/pkg/apis/meta/v1"
RUNTIME_IMPORT = "k8s.io/apimachinery/pkg/runtime"
ROOT_KIND = "KubeSchedulerConfiguration"
DEFAULT_MINORS = range(20, 37)

INTEGER_RANGES = {
    "int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
    "int64": (-2**63, 2**63 - 1), "int": (-2**63, 2**63 - 1),
    "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1), "uint": (0, 2**64 - 1),
}

Schema = dict[str, Any]


class GoTypeError(Exception):
    """A Go declaration the generator cannot translate faithfully."""


@dataclass
class GoField:
    """One struct field: its Go name (None when embedded), Go type and json tag (None when absent)."""

    name: str | None
    type: str
    json_tag: str | None


@dataclass
class GoPackage:
    """The type declarations and imports of one Go package (its non-test, non-generated files)."""

    import_path: str
    structs: dict[str, list[GoField]] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)  # type Name Underlying
    imports: dict[str, str] = field(default_factory=dict)  # alias -> import path
    registered: list[str] = field(default_factory=list)  # kinds addKnownTypes registers
    api_version: str | None = None
    files: list[str] = field(default_factory=list)


def strip_comments(source: str) -> str:
    """Go source without comments (string, rune and raw-string literals kept)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            if end < 0:
                raise GoTypeError("unterminated block comment")
            i = end + 2
        elif c in "\"'`":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if c != "`" and source[j] == "\\" else 1
            out.append(source[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


FIELD_RE = re.compile(r"^(?:(?P<name>[A-Za-z_]\w*)\s+)?"  # no name: an embedded field
                      r"(?P<type>[*\[\]\w.]+(?:\[[\w.*]+\][*\[\]\w.]+)?)\s*"  # T, *T, []T, pkg.T, map[K]V
                      r"(?:`(?P<tag>[^`]*)`)?$")
GROUP_VERSION_RE = re.compile(r'SchemeGroupVersion\s*=\s*schema\.GroupVersion\{Group:\s*(\w+|"[^"]*"),'
                              r'\s*Version:\s*"([^"]+)"\}')
JSON_TAG_RE = re.compile(r'(?:^|\s)json:"([^"]*)"')


def parse_struct_body(body: str, struct: str) -> list[GoField]:
    """The fields of one struct body (between its braces)."""
    fields: list[GoField] = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = FIELD_RE.match(line)
        if match is None:
            raise GoTypeError(f"struct {struct}: cannot read the field line {line!r}")
        tag = match.group("tag")
        json_tag = None
        if tag is not None:
            json_match = JSON_TAG_RE.search(tag)
            json_tag = json_match.group(1) if json_match else None
        fields.append(GoField(match.group("name"), match.group("type"), json_tag))
    return fields


def parse_package(import_path: str, sources: dict[str, str]) -> GoPackage:
    """A GoPackage from its files' sources (path -> text)."""
    package = GoPackage(import_path, files=sorted(sources))
    for path in sorted(sources):
        text = strip_comments(sources[path])
        for block in re.finditer(r"^import\s*\((.*?)^\)", text, re.M | re.S):
            for line in block.group(1).splitlines():
                imp = re.match(r'^\s*(?:(\w+)\s+)?"([^"]+)"\s*$', line)
                if imp:
                    path_ = imp.group(2)
                    package.imports[imp.group(1) or path_.rsplit("/", 1)[-1]] = path_
        for single in re.finditer(r'^import\s+(?:(\w+)\s+)?"([^"]+)"', text, re.M):
            package.imports[single.group(1) or single.group(2).rsplit("/", 1)[-1]] = single.group(2)
        for struct in re.finditer(r"^type\s+(\w+)\s+struct\s*\{(.*?)^\}", text, re.M | re.S):
            if "{" in struct.group(2):
                raise GoTypeError(f"struct {struct.group(1)} has a nested struct; not supported")
            package.structs[struct.group(1)] = parse_struct_body(struct.group(2), struct.group(1))
        for named in re.finditer(r"^type\s+(\w+)\s*=?\s*([*\[\]\w.]+)\s*$", text, re.M):
            package.named[named.group(1)] = named.group(2)
        version = GROUP_VERSION_RE.search(text)
        if version:
            group = version.group(1)
            if not group.startswith('"'):
                group_match = re.search(rf'\b{group}\s*=\s*"([^"]+)"', text)
                if group_match is None:
                    raise GoTypeError(f"{path}: cannot find the value of {group}")
                group = group_match.group(1)
            package.api_version = f"{group.strip(chr(34))}/{version.group(2)}"
        for known in re.finditer(r"AddKnownTypes\(\s*SchemeGroupVersion\s*,(.*?)\)", text, re.S):
            package.registered += re.findall(r"&(\w+)\{\}", known.group(1))
    return package


def builtin_schema(go_type: str) -> Schema | None:
    """The schema of a Go predeclared type (string, bool, the integers and floats), else None."""
    if go_type == "string":
        return {"type": "string"}
    if go_type == "bool":
        return {"type": "boolean"}
    if go_type in INTEGER_RANGES:
        low, high = INTEGER_RANGES[go_type]
        return {"type": "integer", "minimum": low, "maximum": high}
    if go_type in ("float32", "float64"):
        return {"type": "number"}
    return None


@dataclass
class Translator:
    """Turns Go types reachable from one struct into schema definitions."""

    packages: dict[str, GoPackage]  # import path -> package
    definitions: dict[str, Schema] = field(default_factory=dict)

    def struct_schema(self, package: GoPackage, name: str, *, shallow: bool = False) -> Schema:
        """The object schema of struct NAME of PACKAGE (its inline embeds flattened in); SHALLOW: the
        fields' own types are left out (any value), for listing a plugin argument kind's fields."""
        properties: dict[str, Schema] = {}
        for go_field in package.structs[name]:
            tag = go_field.json_tag
            parts = tag.split(",") if tag is not None else [""]
            json_name, options = parts[0], parts[1:]
            if json_name == "-" and not options:
                continue
            embedded = go_field.name is None
            if go_field.name is not None and not go_field.name[0].isupper():
                continue  # unexported: encoding/json ignores it
            if embedded and json_name == "" and (tag is None or "inline" in options):
                inner = self.resolve(package, go_field.type.lstrip("*"))
                target = self.definitions[inner["$ref"]] if "$ref" in inner else inner
                if target.get("type") != "object" or "properties" not in target:
                    raise GoTypeError(f"{name}: inline field of type {go_field.type} is not a struct")
                for key, value in target["properties"].items():
                    properties.setdefault(key, value)
                continue
            key = json_name or (go_field.name or go_field.type.rsplit(".", 1)[-1])
            properties[key] = {"type": "any"} if shallow else self.resolve(package, go_field.type)
        return {"type": "object", "properties": properties, "additionalProperties": False}

    def resolve(self, package: GoPackage, go_type: str) -> Schema:
        """The schema of GO_TYPE as written in PACKAGE."""
        schema = self.composite(package, go_type) or builtin_schema(go_type)
        if schema is not None:
            return schema
        if "." in go_type:
            alias, name = go_type.split(".", 1)
            if alias not in package.imports:
                raise GoTypeError(f"{package.import_path}: {go_type}: package {alias} is not imported")
            return self.resolve_external(package.imports[alias], name)
        if go_type in package.structs:
            ref = f"{package.import_path}.{go_type}"
            if ref not in self.definitions:
                self.definitions[ref] = {}  # placeholder against recursion
                self.definitions[ref] = self.struct_schema(package, go_type)
            return {"$ref": ref}
        if go_type in package.named:
            return self.resolve(package, package.named[go_type])
        raise GoTypeError(f"{package.import_path}: unknown Go type {go_type}")

    def composite(self, package: GoPackage, go_type: str) -> Schema | None:
        """The schema of a pointer, slice or map type, else None."""
        if go_type.startswith("*"):
            return {**self.resolve(package, go_type[1:]), "nullable": True}
        if go_type == "[]byte":
            return {"type": "string", "format": "base64"}
        if go_type.startswith("[]"):
            return {"type": "array", "items": self.resolve(package, go_type[2:]), "nullable": True}
        map_match = re.fullmatch(r"map\[(\w+)\](.+)", go_type)
        if map_match:
            if map_match.group(1) != "string":
                raise GoTypeError(f"map key type {map_match.group(1)} not supported")
            return {"type": "object", "additionalProperties": self.resolve(package, map_match.group(2)),
                    "nullable": True}
        return None

    def resolve_external(self, import_path: str, name: str) -> Schema:
        """The schema of NAME from another package."""
        if import_path == METAV1_IMPORT and name == "Duration":
            return {"type": "string", "format": "go-duration"}
        if import_path == METAV1_IMPORT and name == "TypeMeta":
            return {"type": "object", "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}},
                    "additionalProperties": False}
        if import_path == RUNTIME_IMPORT and name == "RawExtension":
            return {"type": "any"}
        if import_path in self.packages:
            return self.resolve(self.packages[import_path], name)
        raise GoTypeError(f"Go type {import_path}.{name} is not known to the generator")


def git(repo: Path, *args: str) -> str:
    """Stdout of git ARGS in REPO (a bare or ordinary clone)."""
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def newest_tag(repo: Path, minor: int) -> str | None:
    """The newest release tag v0.MINOR.P of REPO, or None when it has none."""
    tags = [t for t in git(repo, "tag", "--list", f"v0.{minor}.*").split() if re.fullmatch(rf"v0\.{minor}\.\d+", t)]
    return max(tags, key=lambda t: int(t.rsplit(".", 1)[1])) if tags else None


def read_package(repo: Path, tag: str, folder: str, import_path: str) -> GoPackage:
    """The Go package in FOLDER of REPO at TAG."""
    names = git(repo, "ls-tree", "--name-only", f"{tag}:{folder}").split()
    sources = {f"{folder}/{n}": git(repo, "show", f"{tag}:{folder}/{n}") for n in names
               if n.endswith(".go") and not n.endswith("_test.go") and not n.startswith("zz_generated")}
    return parse_package(import_path, sources)


def source_record(repository: str, repo: Path, tag: str, files: list[str]) -> Schema:
    """Where a schema's types come from: repository, tag, commit and files."""
    return {"repository": repository, "tag": tag, "commit": git(repo, "rev-parse", f"{tag}^{{commit}}").strip(),
            "files": files}


def schemas_for_minor(kube_scheduler: Path, component_base: Path, minor: int) -> list[Schema]:
    """One schema per API version that kube-scheduler 1.MINOR serves (empty when a tag is missing)."""
    ks_tag, cb_tag = newest_tag(kube_scheduler, minor), newest_tag(component_base, minor)
    if ks_tag is None or cb_tag is None:
        print(f"Kubernetes 1.{minor}: no v0.{minor}.* tag in "
              f"{'kube-scheduler' if ks_tag is None else 'component-base'}; skipped", file=sys.stderr)
        return []
    base = read_package(component_base, cb_tag, "config/v1alpha1", COMPONENT_BASE_IMPORT)
    folders = [n for n in git(kube_scheduler, "ls-tree", "--name-only", f"{ks_tag}:config").split()
               if re.fullmatch(r"v\d+(?:(?:alpha|beta)\d+)?", n)]
    packages = {COMPONENT_BASE_IMPORT: base}
    for folder in folders:
        packages[KUBE_SCHEDULER_IMPORT + folder] = read_package(kube_scheduler, ks_tag, f"config/{folder}",
                                                                KUBE_SCHEDULER_IMPORT + folder)
    schemas = []
    for folder in folders:
        package = packages[KUBE_SCHEDULER_IMPORT + folder]
        if ROOT_KIND not in package.registered:
            continue  # e.g. the Policy-only v1 of 1.20-1.22
        if package.api_version is None:
            raise GoTypeError(f"{ks_tag} config/{folder}: no SchemeGroupVersion found")
        translator = Translator(packages)
        root = translator.resolve(package, ROOT_KIND)
        plugin_args = {kind: sorted(translator.struct_schema(package, kind, shallow=True)["properties"])
                       for kind in package.registered if kind.endswith("Args")}
        scheduler_files = sorted({f for path, p in packages.items() if path.startswith(KUBE_SCHEDULER_IMPORT) and (
            p is package or any(ref.startswith(path + ".") for ref in translator.definitions)) for f in p.files})
        schemas.append({
            "kubernetes": f"1.{minor}",
            "apiVersion": package.api_version,
            "kinds": package.registered,
            "root": root["$ref"],
            "definitions": dict(sorted(translator.definitions.items())),
            "pluginArgs": dict(sorted(plugin_args.items())),
            "sources": [
                source_record(KUBE_SCHEDULER_REPO, kube_scheduler, ks_tag, scheduler_files),
                source_record(COMPONENT_BASE_REPO, component_base, cb_tag, base.files),
            ],
            "generatedBy": "tests/unit/deploy/generate_scheduler_config_schemas.py",
        })
    return schemas


def schema_file_name(schema: Schema) -> str:
    """``1.25-v1beta2.json`` for Kubernetes 1.25's kubescheduler.config.k8s.io/v1beta2."""
    return f"{schema['kubernetes']}-{schema['apiVersion'].rsplit('/', 1)[1]}.json"


def main(argv: list[str] | None = None) -> int:
    """Regenerate SCHEMA_DIR from the two clones; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kube-scheduler-git", type=Path, required=True, help="clone of kubernetes/kube-scheduler")
    parser.add_argument("--component-base-git", type=Path, required=True, help="clone of kubernetes/component-base")
    parser.add_argument("--minors", default=f"{DEFAULT_MINORS.start}-{DEFAULT_MINORS.stop - 1}",
                        help="Kubernetes 1.x minors, FIRST-LAST (default %(default)s)")
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR)
    args = parser.parse_args(argv)
    first, _, last = args.minors.partition("-")
    if not (first.isdigit() and (last or first).isdigit()):
        parser.error(f"--minors {args.minors!r}: expected FIRST-LAST, e.g. 20-36")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.json"):
        old.unlink()
    try:
        for minor in range(int(first), int(last or first) + 1):
            for schema in schemas_for_minor(args.kube_scheduler_git, args.component_base_git, minor):
                path = args.out / schema_file_name(schema)
                path.write_text(json.dumps(schema, indent=1, sort_keys=False) + "\n")
                print(f"wrote {path}")
    except GoTypeError as error:
        print(f"generate_scheduler_config_schemas: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
