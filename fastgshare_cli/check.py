"""``fastgshare check``: validate manifests whole, file by file, and print what was found.

For every object in the files (directories are searched for ``.yaml``, ``.yml`` and ``.json``;
``-`` reads standard input): its GPU share, anything that would make the share go unread (see
:mod:`fastgshare.workload`), unknown ``fastgshare/`` annotations with the nearest known key,
and the object's Kubernetes schema (see :mod:`fastgshare_cli.schema`). A file holding a
workload list (``fastgshare pack``'s input) is checked entry by entry, and a function profile
(``fastgshare plan``'s input, :mod:`fastgshare.profile`) as a whole.

Output is a table, or with ``-o json`` a list of objects; problems go to standard error, one
line each under their object. Exit status 1 if any object is invalid or any file unreadable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
from rich.console import Console
from rich.table import Table

from fastgshare.errors import FastGShareError
from fastgshare.profile import ProfileError, decode_profile
from fastgshare.quantity import format_bytes
from fastgshare.share import ShareSpec, format_fraction
from fastgshare.workload import ManifestShare, manifest_shares, workload_list_shares
from fastgshare_cli import schema
from fastgshare_cli.documents import DocumentError, load_documents, manifest_files

EXIT_OK, EXIT_INVALID = 0, 1
OK, INVALID, SKIPPED, UNREADABLE = "ok", "invalid", "skipped", "unreadable"


@attrs.frozen(kw_only=True)
class Checked:
    """One object of one file (or a file that could not be read), and what is wrong with it."""

    file: str
    object: str = ""
    replicas: int | None = None
    share: ShareSpec | None = None
    problems: tuple[str, ...] = ()
    note: str = ""
    readable: bool = True

    @property
    def result(self) -> str:
        if not self.readable:
            return UNREADABLE
        if self.problems:
            return INVALID
        return SKIPPED if self.note else OK


def check_paths(paths: Sequence[str]) -> list[Checked]:
    """Every object of every file under ``paths``, in order."""
    checked: list[Checked] = []
    for path in paths:
        try:
            files = manifest_files(path)
        except DocumentError as error:
            checked.append(Checked(file=path, problems=(str(error),), readable=False))
            continue
        for file in files:
            checked.extend(check_file(file))
    return checked


def check_file(path: str) -> list[Checked]:
    try:
        documents = load_documents(path)
        if len(documents) == 1 and isinstance(documents[0], list):  # a workload list
            return [_checked(path, found, None, f"entry {position}")
                    for position, found in enumerate(workload_list_shares(documents[0]))]
        if len(documents) == 1 and _is_profile(documents[0]):
            return [_profile(path, documents[0])]
        return [_checked(path, found, document) for document in documents for found, document
                in _objects(document)]
    except (DocumentError, FastGShareError) as error:
        message = str(error) if str(error).startswith(path) else f"{path}: {error}"
        return [Checked(file=path, problems=(message,), readable=False)]


def _is_profile(document: object) -> bool:
    return isinstance(document, dict) and "kind" not in document and {"function", "points"} <= document.keys()


def _profile(path: str, document: object) -> Checked:
    """A function profile: valid as :func:`fastgshare.profile.decode_profile` reads it, or why not."""
    name = str(document.get("function", "")) if isinstance(document, dict) else ""
    try:
        profile = decode_profile(json.dumps(document))
    except ProfileError as error:
        return Checked(file=path, object=f"Profile/{name}", problems=(str(error),))
    return Checked(file=path, object=f"Profile/{profile.function}")


def _objects(document: object) -> list[tuple[ManifestShare, dict[str, object] | None]]:
    """Each object of a document with its share; the items of a ``List`` one by one."""
    if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
        return [pair for item in document["items"] for pair in _objects(item)]
    return [(found, document if isinstance(document, dict) else None) for found in manifest_shares(document)]


def _checked(path: str, found: ManifestShare, document: dict[str, object] | None, position: str = "") -> Checked:
    problems = [str(problem) for problem in found.all_problems]
    if found.share is None and found.error is None and found.skipped and found.kind == "workload":
        problems.append(found.skipped)  # a malformed workload entry
    if document is not None:
        problems.extend(schema.schema_problems(document) or [])
    note = found.skipped if not problems and found.share is None else ""
    return Checked(file=path, object=f"{found.kind}/{found.name or position}", replicas=found.replicas,
                   share=found.share,
                   problems=tuple(problems), note=note)


def run_check(paths: Sequence[str], output: str, console: Console, errors: Console) -> int:
    checked = check_paths(paths)
    if output == "json":
        console.print_json(json.dumps([_json(item) for item in checked]))
    else:
        console.print(_table(checked))
    for item in checked:
        if item.problems and item.readable:
            errors.print(f"{item.file}: {item.object}:", markup=False, highlight=False)
            for problem in item.problems:
                errors.print(f"  - {problem}", markup=False, highlight=False)
        elif item.problems:
            errors.print(item.problems[0], markup=False, highlight=False)
    if not schema.available():
        errors.print(f"note: the Kubernetes schema of the objects was not checked; {schema.INSTALL_HINT}",
                     markup=False, highlight=False)
    return EXIT_INVALID if any(item.result in (INVALID, UNREADABLE) for item in checked) else EXIT_OK


def _table(checked: Sequence[Checked]) -> Table:
    table = Table()
    for column in ("file", "object", "replicas", "request", "limit", "SM %", "memory", "result"):
        table.add_column(column, overflow="fold")
    for item in checked:
        table.add_row(item.file, item.object, "" if item.replicas is None else str(item.replicas),
                      *_share_cells(item.share), _result_cell(item))
    return table


def _share_cells(share: ShareSpec | None) -> tuple[str, str, str, str]:
    if share is None:
        return "", "", "", ""
    return (format_fraction(share.request_permille), format_fraction(share.limit_permille),
            str(share.sm_percent), format_bytes(share.memory_bytes))


def _result_cell(item: Checked) -> str:
    if item.result == INVALID:
        count = len(item.problems)
        return f"[red]invalid ({count} problem{'s' if count != 1 else ''})[/red]"
    if item.result == UNREADABLE:
        return "[red]unreadable[/red]"
    if item.result == SKIPPED:
        return f"skipped: {item.note}"
    return "[green]ok[/green]"


def _json(item: Checked) -> dict[str, object]:
    share = None if item.share is None else {
        "request": format_fraction(item.share.request_permille), "limit": format_fraction(item.share.limit_permille),
        "smPercent": item.share.sm_percent, "memoryBytes": item.share.memory_bytes}
    return {"file": item.file, "object": item.object, "replicas": item.replicas, "result": item.result,
            "share": share, "problems": list(item.problems), "note": item.note}
