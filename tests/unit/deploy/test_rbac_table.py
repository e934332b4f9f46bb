"""Least privilege that holds: every Role and ClusterRole under deploy/ against the checked-in table.

``docs/rbac-table.yaml`` says, per component (its service account), role, scope, API group and
resource, which verbs it holds and why. A verb granted in a manifest that the table does not list
fails here, naming it, and so does a verb the table lists that no manifest grants: a new right
needs a row with its reason. The bindings are checked too: each role is bound to the component the
table names, at the scope it names, and a binding to a built-in role is listed with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from fastgshare import keys
from tests.deploy_manifests import DEPLOY, kustomization

TABLE = DEPLOY.parent / "docs" / "rbac-table.yaml"
ROLE_KINDS = ("Role", "ClusterRole")
BINDING_KINDS = ("RoleBinding", "ClusterRoleBinding")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
USERS = "users"  # the component of the aggregated roles: whoever holds edit/view/admin
MIN_REASON = 12  # characters: a reason, not a placeholder


class Grant(NamedTuple):
    """One verb on one resource (or resource name) in one role, at one scope."""

    component: str
    role: str
    scope: str
    api_group: str
    resource: str
    resource_name: str
    verb: str

    def __str__(self) -> str:
        resource = f"{self.api_group}/{self.resource}" if self.api_group else self.resource
        name = f" named {self.resource_name}" if self.resource_name else ""
        return f"{self.component}: {self.role} ({self.scope}) {self.verb} {resource}{name}"


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and "kind" in doc:
            yield doc


def deploy_objects() -> list[dict[str, Any]]:
    """Every object of every YAML file under deploy/ (the kustomization's and the others)."""
    return [doc for path in sorted(DEPLOY.rglob("*.yaml")) if path != TABLE for doc in _documents(path)]


def role_id(kind: str, name: str, namespace: str | None) -> str:
    """``Role NS/NAME``, ``ClusterRole NAME`` (and so for bindings), as the table names them."""
    return f"{kind} {namespace}/{name}" if kind in ("Role", "RoleBinding") else f"{kind} {name}"


def _service_account(subject: dict[str, Any]) -> str:
    if subject.get("kind") == "ServiceAccount":
        return str(subject["name"])
    return f"{subject.get('kind')} {subject.get('name')}"


class Manifests:
    """The roles and bindings under deploy/, as grants with their component and scope."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.roles = {role_id(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o
                      for o in objects if o["kind"] in ROLE_KINDS}
        self.bindings = [o for o in objects if o["kind"] in BINDING_KINDS]

    def bound_to(self, role: str) -> list[tuple[str, str]]:
        """(component, scope) of every binding of ``role``."""
        found: list[tuple[str, str]] = []
        for binding in self.bindings:
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace")
            target = role_id(ref["kind"], ref["name"], namespace if ref["kind"] == "Role" else None)
            if target != role:
                continue
            scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else f"namespace {namespace}"
            found.extend((_service_account(subject), scope) for subject in binding.get("subjects") or [])
        return found

    def owner(self, role: str) -> tuple[str, str]:
        """The component and scope of ``role``: its one binding's, or users' for an aggregated role."""
        labels = self.roles[role]["metadata"].get("labels") or {}
        aggregated = sorted(key.removeprefix(AGGREGATE) for key, value in labels.items()
                            if key.startswith(AGGREGATE) and value == "true")
        bound = sorted(set(self.bound_to(role)))
        if aggregated:
            assert not bound, f"{role} is aggregated into {aggregated} and also bound directly: {bound}"
            return USERS, f"aggregated into {', '.join(aggregated)}"
        assert len(bound) == 1, f"{role} must be bound to exactly one component at one scope, found {bound}"
        return bound[0]

    def grants(self) -> set[Grant]:
        found: set[Grant] = set()
        for role, obj in self.roles.items():
            component, scope = self.owner(role)
            for rule in obj.get("rules") or []:
                for group in rule.get("apiGroups") or [""]:
                    for resource in rule.get("resources") or rule.get("nonResourceURLs") or []:
                        for name in rule.get("resourceNames") or [""]:
                            found.update(Grant(component, role, scope, group, resource, name, verb)
                                         for verb in rule["verbs"])
        return found


def table() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(TABLE.read_text())
    return data


def table_grants() -> dict[Grant, str]:
    """Every verb of the table with its reason."""
    found: dict[Grant, str] = {}
    for row in table()["rows"]:
        for verb, reason in row["verbs"].items():
            for name in row.get("resourceNames") or [""]:
                grant = Grant(row["component"], row["role"], row["scope"], row.get("apiGroup", ""), row["resource"],
                              name, verb)
                assert grant not in found, f"the table lists {grant} twice"
                found[grant] = str(reason or "")
    return found


MANIFESTS = Manifests(deploy_objects())


def test_no_role_grants_a_verb_the_table_does_not_list() -> None:
    extra = sorted(str(grant) for grant in MANIFESTS.grants() - table_grants().keys())
    assert not extra, "granted under deploy/ but not in docs/rbac-table.yaml (add a row with its reason, or " \
                      "remove the verb):\n  " + "\n  ".join(extra)


def test_the_table_lists_no_verb_that_no_role_grants() -> None:
    missing = sorted(str(grant) for grant in table_grants().keys() - MANIFESTS.grants())
    assert not missing, "in docs/rbac-table.yaml but granted by no Role or ClusterRole under deploy/:\n  " + \
                        "\n  ".join(missing)


def test_every_verb_has_a_reason() -> None:
    vague = sorted(str(grant) for grant, reason in table_grants().items() if len(reason.strip()) < MIN_REASON)
    assert not vague, "verbs without a reason in docs/rbac-table.yaml:\n  " + "\n  ".join(vague)


def test_every_binding_to_a_role_we_do_not_ship_is_listed_with_its_reason() -> None:
    listed = {(row["component"], row["binding"], row["role"]): row["reason"] for row in table()["builtinRoles"]}
    found = set()
    for binding in MANIFESTS.bindings:
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = role_id(ref["kind"], ref["name"], namespace if ref["kind"] == "Role" else None)
        if role in MANIFESTS.roles:
            continue
        for subject in binding.get("subjects") or []:
            found.add((_service_account(subject), role_id(binding["kind"], binding["metadata"]["name"], namespace),
                       role))
    assert found == set(listed), f"bindings to built-in roles: deploy/ has {sorted(found)}, the table {sorted(listed)}"
    assert all(len(str(reason).strip()) >= MIN_REASON for reason in listed.values())


# --- what the table itself must say: the rights issue 37 (item 6) took away stay away ------------

def _verbs(component: str, resource: str, api_group: str = "") -> dict[str, set[str]]:
    """Scope -> verbs of ``component`` on ``resource``, from the manifests."""
    found: dict[str, set[str]] = {}
    for grant in MANIFESTS.grants():
        if (grant.component, grant.api_group, grant.resource) == (component, api_group, resource):
            found.setdefault(grant.scope, set()).add(grant.verb)
    return found


def test_the_node_agent_deletes_nothing() -> None:
    agent = [g for g in MANIFESTS.grants() if g.component == keys.NODE_AGENT_SERVICE_ACCOUNT]
    assert agent
    assert not [str(g) for g in agent if g.verb in ("delete", "deletecollection")]
    assert _verbs(keys.NODE_AGENT_SERVICE_ACCOUNT, "pods") == {"cluster": {"get", "list", "watch", "patch"}}
    assert _verbs(keys.NODE_AGENT_SERVICE_ACCOUNT, "nodes") == {"cluster": {"get", "patch"}}
    assert _verbs(keys.NODE_AGENT_SERVICE_ACCOUNT, "events") == {"cluster": {"create", "patch"}}


FUNCTION_CONTROLLER = "fastgshare-function-controller"
IN_FUNCTIONS = f"namespace {keys.DEFAULT_FUNCTION_NAMESPACE}"


def test_the_function_controller_changes_services_and_reads_configmaps_only_in_the_function_namespace() -> None:
    assert _verbs(FUNCTION_CONTROLLER, "services") == {IN_FUNCTIONS: {"list", "watch", "create", "patch"}}
    assert _verbs(FUNCTION_CONTROLLER, "configmaps") == {IN_FUNCTIONS: {"get"}}
    for resource in ("fastfuncs", "fastpods", "fastfuncs/status", "fastfuncs/finalizers"):
        assert set(_verbs(FUNCTION_CONTROLLER, resource, keys.API_GROUP)) == {IN_FUNCTIONS}, resource
    # cluster-wide: reads only, for the GPU fit check (every GPU pod's assignment, every node's inventory)
    cluster = {g.verb for g in MANIFESTS.grants() if g.component == FUNCTION_CONTROLLER and g.scope == "cluster"}
    assert cluster == {"list"}


def test_no_component_reads_secrets_or_uses_wildcards() -> None:
    for grant in MANIFESTS.grants():
        assert "*" not in (grant.verb, grant.resource, grant.api_group, grant.resource_name), str(grant)
        assert grant.resource != "secrets", str(grant)
    assert not [str(g) for g in MANIFESTS.grants() if g.resource in ("roles", "clusterroles", "rolebindings",
                                                                      "clusterrolebindings")]


# --- the roles a namespace's users get for our kinds (deploy/crd/roles.yaml) ----------------------

READ = {"get", "list", "watch"}
WRITE = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.mark.parametrize(("level", "verbs"), [("view", READ), ("edit", READ | WRITE), ("admin", READ | WRITE)])
def test_namespace_users_get_our_kinds_through_the_built_in_roles(level: str, verbs: set[str]) -> None:
    roles = [o for o in MANIFESTS.roles.values()
             if (o["metadata"].get("labels") or {}).get(f"{AGGREGATE}{level}") == "true"]
    assert len(roles) == 1, f"one ClusterRole aggregated into {level}, found {len(roles)}"
    [role] = roles
    assert role["kind"] == "ClusterRole"
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [keys.API_GROUP]
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert granted[keys.FASTPOD_PLURAL] == verbs
    assert granted[keys.FASTFUNC_PLURAL] == verbs
    status = {resource: verbs for resource, verbs in granted.items() if "/" in resource}
    assert status == {f"{keys.FASTPOD_PLURAL}/status": {"get"}, f"{keys.FASTFUNC_PLURAL}/status": {"get"}}


def test_the_aggregated_roles_are_applied_with_the_crds() -> None:
    resources = kustomization()["resources"]
    assert "crd/roles.yaml" in resources
    assert resources.index("crd/roles.yaml") > resources.index("crd/fastfuncs.yaml")
