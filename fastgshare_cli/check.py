"""``fastgshare check``: validate manifests whole, file by file, and print what was found.

For every object in the files (directories are searched for ``.yaml``, ``.yml`` and ``.json``;
``-`` reads standard input): its GPU share, anything that would make the share go unread (see
:mod:`fastgshare.workload`), unknown ``fastgshare/`` annotations with the nearest known key,
and the object's Kubernetes schema (see :mod:`fastgshare_cli.schema`). A file holding a
workload list (``fastgshare pack``'s input) is checked entry by entry, and a function profile
(``fastgshare plan``'s input, :mod:`fastgshare.profile`) as a whole.

A Pod or pod template that asks for the vGPU resource is judged as the admission webhook will
change it (:mod:`fastgshare.scheduler_routing`): naming the default scheduler is not a problem but a
notice (the webhook sets ``schedulerName: fastgshare-scheduler``), naming another scheduler a
warning (the webhook admits it with that warning). With ``webhook=False`` (``--no-webhook``: a
cluster without the webhook) both are problems, as the pod's share would go unread.

Output is a table, or with ``-o json`` a list of objects; problems, then notices, go to standard
error, one line each under their object. Exit status 1 if any object is invalid or any file
unreadable; notices alone leave it 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
from rich.console import Console
from rich.table import Table

from fastgshare.errors import FastGShareError, FieldProblem
from fastgshare.profile import ProfileError, decode_profile
from fastgshare.quantity import format_bytes
from fastgshare.scheduler_routing import Route, route
from fastgshare.share import ShareSpec, format_fraction
from fastgshare.workload import TEMPLATED_KINDS, ManifestShare, manifest_shares, workload_list_shares
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
    notices: tuple[str, ...] = ()  # what the admission webhook will do with it; not problems
    readable: bool = True

    @property
    def result(self) -> str:
        if not self.readable:
            return UNREADABLE
        if self.problems:
            return INVALID
        return SKIPPED if self.note else OK


def check_paths(paths: Sequence[str], *, webhook: bool = True) -> list[Checked]:
    """Every object of every file under ``paths``, in order; ``webhook``: judged as the admission
    webhook will change it (see the module's docstring)."""
    checked: list[Checked] = []
    for path in paths:
        try:
            files = manifest_files(path)
        except DocumentError as error:
            checked.append(Checked(file=path, problems=(str(error),), readable=False))
            continue
        for file in files:
            checked.extend(check_file(file, webhook=webhook))
    return checked


def check_file(path: str, *, webhook: bool = True) -> list[Checked]:
    try:
        documents = load_documents(path)
        if len(documents) == 1 and isinstance(documents[0], list):  # a workload list
            return [_checked(path, found, None, f"entry {position}")
                    for position, found in enumerate(workload_list_shares(documents[0]))]
        if len(documents) == 1 and _is_profile(documents[0]):
            return [_profile(path, documents[0])]
        return [_checked(path, found, document, webhook=webhook) for document in documents for found, document
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


def _checked(path: str, found: ManifestShare, document: dict[str, object] | None, position: str = "", *,
             webhook: bool = True) -> Checked:
    notices, routed = _webhook_notices(document) if webhook else ((), "")
    problems = [str(problem) for problem in found.all_problems if not _is_field(problem, routed)]
    if found.share is None and found.error is None and found.skipped and found.kind == "workload":
        problems.append(found.skipped)  # a malformed workload entry
    if document is not None:
        problems.extend(schema.schema_problems(document) or [])
    note = found.skipped if not problems and found.share is None else ""
    return Checked(file=path, object=f"{found.kind}/{found.name or position}", replicas=found.replicas,
                   share=found.share, problems=tuple(problems), note=note, notices=notices)


def _webhook_notices(document: dict[str, object] | None) -> tuple[tuple[str, ...], str]:
    """What the webhook will say of a Pod's or pod template's scheduler, and the field it answers for
    (its problem is then no problem); nothing for other objects and pods it leaves alone."""
    kind = document.get("kind") if document is not None else None
    spec = _mapping(document.get("spec") if document is not None else None)
    if kind == "Pod":
        pod_spec, where = spec, "spec"
    elif kind in TEMPLATED_KINDS:
        pod_spec, where = _mapping(_mapping(spec.get("template")).get("spec")), "spec.template.spec"
    else:
        return (), ""
    routing = route(pod_spec)
    if routing.route is Route.SET:
        return (f"note: {where}.{routing.note}",), f"{where}.schedulerName"
    if routing.route is Route.WARN:
        return (f"warning: {routing.warning}",), f"{where}.schedulerName"
    return (), ""


def _is_field(problem: FieldProblem, field: str) -> bool:
    return bool(field) and problem.field == field


def _mapping(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def run_check(paths: Sequence[str], output: str, console: Console, errors: Console, *, webhook: bool = True) -> int:
    checked = check_paths(paths, webhook=webhook)
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
        if item.notices:
            if not item.problems:
                errors.print(f"{item.file}: {item.object}:", markup=False, highlight=False)
            for notice in item.notices:
                errors.print(f"  - {notice}", markup=False, highlight=False)
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
    return "[green]ok[/green]" + (" (see notes)" if item.notices else "")


def _json(item: Checked) -> dict[str, object]:
    share = None if item.share is None else {
        "request": format_fraction(item.share.request_permille), "limit": format_fraction(item.share.limit_permille),
        "smPercent": item.share.sm_percent, "memoryBytes": item.share.memory_bytes}
    return {"file": item.file, "object": item.object, "replicas": item.replicas, "result": item.result,
            "share": share, "problems": list(item.problems), "note": item.note, "notices": list(item.notices)}
