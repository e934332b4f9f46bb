"""The kube-scheduler configurations install.sh picks, checked against each release's published types.

For every Kubernetes minor 1.20-1.36, deploy/install.sh's ``scheduler_config_for`` names one file in
deploy/scheduler/; that file must use an API version the minor's kube-scheduler serves and must
decode strictly into that version's ``KubeSchedulerConfiguration``: an unknown or misplaced field,
a duplicated key, a wrong value type (a duration Go's ``time.ParseDuration`` cannot read, a
non-integer weight, a string for a bool) fail. The types come from the JSON schemas in
``kube_scheduler_config_schemas/``, written by ``generate_scheduler_config_schemas.py`` from
kubernetes/kube-scheduler and kubernetes/component-base at each minor's newest release tag (each
schema records its repository, tag, commit and files). Only 1.20 also runs for real (tests/cluster).

The score plugins the files name must score in that release. kube-scheduler's plugin registry lives
in kubernetes/kubernetes, which cannot be brought here; the evidence used instead is the release's
published plugin argument kind and its scoring field (``NodeResourcesFitArgs.scoringStrategy``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy import generate_scheduler_config_schemas as generator

REPO = Path(__file__).resolve().parents[3]
INSTALL = REPO / "deploy" / "install.sh"
SCHEDULER = REPO / "deploy" / "scheduler"
SCHEMA_DIR = generator.SCHEMA_DIR
MINORS = range(20, 37)  # 1.20 ... 1.36: every minor the schema data covers
GO_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)")
# A score plugin named in a configuration scores in a release when that release publishes this
# argument kind with this field (its scoring parameters).
SCORE_EVIDENCE = {
    "NodeResourcesFit": ("NodeResourcesFitArgs", "scoringStrategy"),
    "NodeResourcesBalancedAllocation": ("NodeResourcesBalancedAllocationArgs", "resources"),
    "NodeResourcesLeastAllocated": ("NodeResourcesLeastAllocatedArgs", "resources"),
}
# NodeResourcesBalancedAllocation took no arguments before 1.22: on 1.20-1.21 nothing published in
# kube-scheduler's types says it scores, so the v1beta1 file's use of it is not checked there.
UNCHECKABLE = {("1.20", "NodeResourcesBalancedAllocation"), ("1.21", "NodeResourcesBalancedAllocation")}
SCHEMA_KEYWORDS = {"type", "properties", "additionalProperties", "items", "$ref", "nullable", "format",
                   "minimum", "maximum"}


class SchemaError(Exception):
    """A configuration that the release's kube-scheduler would refuse (one line: path, value, allowed)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a mapping with the same key twice (kube-scheduler's strict decoding does)."""


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(key_node, deep=deep) for key_node, _ in node.value]
    duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
    if duplicates:
        raise SchemaError(f"line {node.start_mark.line + 1}: duplicated field(s) {', '.join(duplicates)}")
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_config(text: str) -> Any:
    """The YAML document TEXT, refusing duplicated keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass


def load_schemas() -> dict[str, dict[str, dict[str, Any]]]:
    """Kubernetes minor ("1.25") -> apiVersion -> schema, from every file in SCHEMA_DIR."""
    schemas: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        schema = json.loads(path.read_text())
        assert path.name == generator.schema_file_name(schema), f"{path.name}: name does not match its content"
        schemas.setdefault(schema["kubernetes"], {})[schema["apiVersion"]] = schema
    return schemas


SCHEMAS = load_schemas()


Checker = Callable[[Any, dict[str, Any], dict[str, Any], str], None]


def check(value: Any, node: dict[str, Any], definitions: dict[str, Any], where: str) -> None:
    """Raise SchemaError unless VALUE decodes strictly into the Go type that NODE describes."""
    unknown = set(node) - SCHEMA_KEYWORDS
    if unknown:  # a schema this walker cannot read must not pass anything
        raise AssertionError(f"schema keyword(s) {sorted(unknown)} at {where} are not understood")
    if value is None and node.get("nullable"):
        return
    if "$ref" in node:
        check(value, definitions[node["$ref"]], definitions, where)
        return
    kind = node["type"]
    if kind not in CHECKERS:
        raise AssertionError(f"schema type {kind!r} at {where} is not understood")
    if value is None and kind != "any":
        raise SchemaError(f"{where}: null is not allowed here; expected {kind}")
    CHECKERS[kind](value, node, definitions, where)


def check_object(value: Any, node: dict[str, Any], definitions: dict[str, Any], where: str) -> None:
    """A mapping whose keys are the struct's json names (or any key, for a Go map)."""
    if not isinstance(value, dict):
        raise SchemaError(f"{where}: {value!r} is not a mapping")
    properties = node.get("properties", {})
    for key, item in value.items():
        if not isinstance(key, str):
            raise SchemaError(f"{where}: key {key!r} is not a string")
        if key in properties:
            check(item, properties[key], definitions, f"{where}.{key}")
        elif isinstance(node.get("additionalProperties"), dict):
            check(item, node["additionalProperties"], definitions, f"{where}.{key}")
        else:
            raise SchemaError(f"{where}.{key}: unknown field; allowed here: {', '.join(sorted(properties))}")


def check_array(value: Any, node: dict[str, Any], definitions: dict[str, Any], where: str) -> None:
    """A list of items of the slice's element type."""
    if not isinstance(value, list):
        raise SchemaError(f"{where}: {value!r} is not a list")
    for index, item in enumerate(value):
        check(item, node["items"], definitions, f"{where}[{index}]")


def check_string(value: Any, node: dict[str, Any], _definitions: dict[str, Any], where: str) -> None:
    """A string; a metav1.Duration one time.ParseDuration reads, a []byte one in base64."""
    if not isinstance(value, str):
        raise SchemaError(f"{where}: {value!r} is not a string")
    form = node.get("format")
    if form == "go-duration":
        if not GO_DURATION.fullmatch(value):
            raise SchemaError(f"{where}: {value!r} is not a Go duration (e.g. 30s, 1m30s, 500ms)")
    elif form == "base64":
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error as error:
            raise SchemaError(f"{where}: {value!r} is not base64 ({error})") from None
    elif form is not None:
        raise AssertionError(f"format {form!r} at {where} is not understood")


def check_boolean(value: Any, _node: dict[str, Any], _definitions: dict[str, Any], where: str) -> None:
    """true or false (not the string "true")."""
    if not isinstance(value, bool):
        raise SchemaError(f"{where}: {value!r} is not a boolean (true or false)")


def check_integer(value: Any, node: dict[str, Any], _definitions: dict[str, Any], where: str) -> None:
    """A whole number in the Go type's range (not a float, a string or a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{where}: {value!r} is not an integer")
    if not node["minimum"] <= value <= node["maximum"]:
        raise SchemaError(f"{where}: {value} is out of range {node['minimum']}..{node['maximum']}")


def check_number(value: Any, _node: dict[str, Any], _definitions: dict[str, Any], where: str) -> None:
    """An integer or a float (not a string or a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where}: {value!r} is not a number")


def check_any(_value: Any, _node: dict[str, Any], _definitions: dict[str, Any], _where: str) -> None:
    """runtime.RawExtension (plugin args): kube-scheduler decodes it by the plugin's Args kind."""


CHECKERS: dict[str, Checker] = {"object": check_object, "array": check_array, "string": check_string,
                                "boolean": check_boolean, "integer": check_integer, "number": check_number,
                                "any": check_any}


def check_config(config: Any, minor: str) -> None:
    """Raise SchemaError unless kube-scheduler 1.x (MINOR, e.g. "1.25") would decode CONFIG."""
    if not isinstance(config, dict):
        raise SchemaError(f"the configuration is {type(config).__name__}, not a mapping")
    served = SCHEMAS[minor]
    api_version = config.get("apiVersion")
    if api_version not in served:
        raise SchemaError(f"apiVersion {api_version!r}: Kubernetes {minor}'s kube-scheduler serves "
                          f"{', '.join(sorted(served))}")
    schema = served[api_version]
    if config.get("kind") != generator.ROOT_KIND or generator.ROOT_KIND not in schema["kinds"]:
        raise SchemaError(f"kind {config.get('kind')!r}: expected {generator.ROOT_KIND}")
    check(config, {"$ref": schema["root"]}, schema["definitions"], "")


def score_plugins(config: dict[str, Any]) -> set[str]:
    """The plugin names a configuration enables or disables under ``score`` in any profile."""
    names = set()
    for profile in config.get("profiles") or []:
        score = ((profile.get("plugins") or {}).get("score")) or {}
        for plugin in (score.get("enabled") or []) + (score.get("disabled") or []):
            names.add(plugin["name"])
    return names


def config_for(version: str) -> str:
    """install.sh's scheduler_config_for VERSION."""
    result = subprocess.run(["bash", "-c", f'source "{INSTALL}" && scheduler_config_for "$1"', "install.sh", version],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


CHOSEN = {f"1.{m}": config_for(f"1.{m}.0") for m in MINORS}
SHIPPED = {name: (SCHEDULER / name).read_text() for name in sorted(set(CHOSEN.values()))}


def test_the_schema_data_covers_every_minor_from_its_recorded_sources() -> None:
    assert sorted(SCHEMAS, key=lambda v: int(v.split(".")[1])) == [f"1.{m}" for m in MINORS]
    for minor, served in SCHEMAS.items():
        for schema in served.values():
            scheduler, component_base = schema["sources"]
            assert scheduler["repository"] == generator.KUBE_SCHEDULER_REPO
            assert component_base["repository"] == generator.COMPONENT_BASE_REPO
            for source in (scheduler, component_base):
                assert re.fullmatch(rf"v0\.{minor.split('.')[1]}\.\d+", source["tag"]), source
                assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), source
                assert source["files"], source


@pytest.mark.parametrize("minor", list(CHOSEN))
def test_the_config_install_sh_picks_decodes_strictly_on_that_release(minor: str) -> None:
    config = load_config(SHIPPED[CHOSEN[minor]])
    check_config(config, minor)


def check_score_plugins(config: dict[str, Any], minor: str) -> None:
    """Raise SchemaError unless every plugin CONFIG names under score scores on Kubernetes MINOR."""
    if config["apiVersion"] not in SCHEMAS[minor]:
        raise SchemaError(f"{config['apiVersion']} is not served on {minor}")
    schema = SCHEMAS[minor][config["apiVersion"]]
    for plugin in sorted(score_plugins(config)):
        if plugin not in SCORE_EVIDENCE:
            raise SchemaError(f"score plugin {plugin}: no way to check it; add it to SCORE_EVIDENCE")
        kind, scoring_field = SCORE_EVIDENCE[plugin]
        if (minor, plugin) in UNCHECKABLE:
            assert kind not in schema["pluginArgs"], f"{kind} is published on {minor}: drop it from UNCHECKABLE"
            continue
        if scoring_field not in schema["pluginArgs"].get(kind, []):
            raise SchemaError(f"score plugin {plugin}: not a score plugin on Kubernetes {minor} "
                              f"({kind}.{scoring_field} is not published)")


@pytest.mark.parametrize("minor", list(CHOSEN))
def test_the_score_plugins_the_config_names_score_on_that_release(minor: str) -> None:
    check_score_plugins(load_config(SHIPPED[CHOSEN[minor]]), minor)


def test_the_served_api_versions_are_those_the_releases_publish() -> None:
    """The published types say: v1beta1 1.20-1.22, v1beta2 1.22-1.27, v1beta3 1.23-1.28, v1 from 1.25."""
    served = {minor: sorted(v.rsplit("/", 1)[1] for v in versions) for minor, versions in SCHEMAS.items()}
    assert served["1.21"] == ["v1beta1"]
    assert served["1.22"] == ["v1beta1", "v1beta2"]
    assert served["1.24"] == ["v1beta2", "v1beta3"]
    assert served["1.25"] == ["v1", "v1beta2", "v1beta3"]
    assert served["1.28"] == ["v1", "v1beta3"]
    assert served["1.29"] == ["v1"]


# Loosening checks: each edit of the shipped v1 configuration must be refused on 1.25, naming where.
def shipped_v1() -> dict[str, Any]:
    config = load_config(SHIPPED["kube-scheduler-config.yaml"])
    assert isinstance(config, dict)
    return copy.deepcopy(config)


def edited(path: str, value: Any, *, drop: str | None = None) -> dict[str, Any]:
    """The shipped v1 configuration with VALUE set at PATH (dots; numbers index lists), DROP removed."""
    config = shipped_v1()
    parts = path.split(".")
    target: Any = config
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    if drop is not None:
        del target[drop]
    target[parts[-1]] = value
    return config


@pytest.mark.parametrize(("config", "message"), [
    (edited("extenders.0.urlPrefx", "http://127.0.0.1:8888", drop="urlPrefix"),
     ".extenders[0].urlPrefx: unknown field"),
    (edited("urlPrefix", "http://127.0.0.1:8888"), ".urlPrefix: unknown field"),
    (edited("leaderElect", True), ".leaderElect: unknown field"),
    (edited("profiles.0.plugins.score.disabled.0.weigth", 1),
     ".profiles[0].plugins.score.disabled[0].weigth: unknown field"),
    (edited("profiles.0.disabled", []), ".profiles[0].disabled: unknown field"),
    (edited("extenders.0.managedResources.0.httpTimeout", "30s"),
     ".extenders[0].managedResources[0].httpTimeout: unknown field"),
    (edited("extenders.0.httpTimeout", 30), ".extenders[0].httpTimeout: 30 is not a string"),
    (edited("extenders.0.httpTimeout", "30"), ".extenders[0].httpTimeout: '30' is not a Go duration"),
    (edited("extenders.0.httpTimeout", "30 seconds"), ".extenders[0].httpTimeout: '30 seconds' is not a Go duration"),
    (edited("leaderElection.leaseDuration", "15sec"), ".leaderElection.leaseDuration: '15sec' is not a Go duration"),
    (edited("extenders.0.weight", 10.5), ".extenders[0].weight: 10.5 is not an integer"),
    (edited("extenders.0.weight", "10"), ".extenders[0].weight: '10' is not an integer"),
    (edited("extenders.0.weight", True), ".extenders[0].weight: True is not an integer"),
    (edited("profiles.0.plugins.score.disabled.0.weight", 2**31), "out of range"),
    (edited("extenders.0.nodeCacheCapable", "true"), ".extenders[0].nodeCacheCapable: 'true' is not a boolean"),
    (edited("leaderElection.leaderElect", "yes please"), ".leaderElection.leaderElect: 'yes please' is not a boolean"),
    (edited("extenders", {"urlPrefix": "x"}), ".extenders: {'urlPrefix': 'x'} is not a list"),
    (edited("kind", "KubeSchedulerConfig"), "kind 'KubeSchedulerConfig'"),
    (edited("apiVersion", "kubescheduler.config.k8s.io/v1beta1"), "apiVersion 'kubescheduler.config.k8s.io/v1beta1'"),
])
def test_a_config_loosened_from_the_types_is_refused_naming_where(config: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(message)):
        check_config(config, "1.25")


def test_the_v1_config_is_refused_by_a_release_that_does_not_serve_v1() -> None:
    served = "kubescheduler.config.k8s.io/v1beta2, kubescheduler.config.k8s.io/v1beta3"
    with pytest.raises(SchemaError, match=re.escape(f"Kubernetes 1.24's kube-scheduler serves {served}")):
        check_config(shipped_v1(), "1.24")


def test_the_v1beta2_config_is_refused_once_v1beta2_is_gone() -> None:
    with pytest.raises(SchemaError, match=re.escape("apiVersion 'kubescheduler.config.k8s.io/v1beta2'")):
        check_config(load_config(SHIPPED["kube-scheduler-config.v1beta2.yaml"]), "1.28")


def test_a_field_of_a_newer_release_is_refused_by_an_older_one() -> None:
    config = edited("delayCacheUntilActive", True)  # a v1 field since 1.28
    check_config(config, "1.33")
    with pytest.raises(SchemaError, match=re.escape(".delayCacheUntilActive: unknown field")):
        check_config(config, "1.25")


def test_a_duplicated_key_is_refused() -> None:
    text = SHIPPED["kube-scheduler-config.yaml"].replace("  weight: 10", "  weight: 10\n  weight: 5")
    with pytest.raises(SchemaError, match=r"duplicated field.*weight"):
        load_config(text)


@pytest.mark.parametrize(("name", "minor", "plugin"), [
    ("kube-scheduler-config.v1beta1.yaml", "1.23", "NodeResourcesLeastAllocated"),  # folded into NodeResourcesFit
    ("kube-scheduler-config.yaml", "1.25", "NodeResourcesLeastAllocated"),
    ("kube-scheduler-config.v1beta1.yaml", "1.21", "NodeResourcesFit"),  # it only filters before 1.22
    ("kube-scheduler-config.yaml", "1.25", "NodeResourceFit"),
])
def test_a_plugin_that_does_not_score_on_a_release_is_refused(name: str, minor: str, plugin: str) -> None:
    config = load_config(SHIPPED[name])
    config["apiVersion"] = min(SCHEMAS[minor])  # any version that release serves
    config["profiles"][0]["plugins"]["score"]["disabled"].append({"name": plugin})
    with pytest.raises(SchemaError, match=f"score plugin {plugin}: "):
        check_score_plugins(config, minor)


@pytest.mark.parametrize(("value", "node"), [
    ("x", {"type": "string", "pattern": "y"}),
    ("x", {"type": "text"}),
    ("x", {"type": "string", "format": "hostname"}),
])
def test_the_walker_refuses_a_schema_it_does_not_understand(value: Any, node: dict[str, Any]) -> None:
    with pytest.raises(AssertionError, match="not understood"):
        check(value, node, {}, "")


@pytest.mark.parametrize("duration", ["30s", "1m30s", "500ms", "1.5h", ".5s", "0", "-2m", "10us", "1µs"])
def test_go_durations_are_accepted(duration: str) -> None:
    check(duration, {"type": "string", "format": "go-duration"}, {}, "")


GO_SOURCE = '''
package v9

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	other "example.com/other"
)

const GroupName = "example.io"

var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v9"}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&Config{}, // the root
	)
	return nil
}

// Config is a test struct. // with a comment.
type Config struct {
	metav1.TypeMeta `json:",inline"`
	Timeout metav1.Duration `json:"timeout,omitempty"` // http://not-a-comment-end
	Weight *int32 `json:"weight"`
	Names []string `json:"names,omitempty"`
	Labels map[string]Mode `json:"labels"`
	Secret []byte `json:"secret"`
	Skipped string `json:"-"`
	hidden string
	Inner `json:",inline"`
}

type Mode string

type Inner struct {
	Deep bool `json:"deep"`
}
'''


def test_the_generator_translates_go_structs_as_encoding_json_reads_them() -> None:
    package = generator.parse_package("example.com/v9", {"types.go": GO_SOURCE})
    assert package.api_version == "example.io/v9"
    assert package.registered == ["Config"]
    translator = generator.Translator({})
    root = translator.resolve(package, "Config")
    properties = translator.definitions[root["$ref"]]["properties"]
    assert properties == {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "timeout": {"type": "string", "format": "go-duration"},
        "weight": {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1, "nullable": True},
        "names": {"type": "array", "items": {"type": "string"}, "nullable": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "nullable": True},
        "secret": {"type": "string", "format": "base64"},
        "deep": {"type": "boolean"},
    }
    assert translator.definitions[root["$ref"]]["additionalProperties"] is False


def test_the_generator_stops_on_a_type_it_does_not_know() -> None:
    source = GO_SOURCE.replace("Deep bool", "Deep other.Thing")
    package = generator.parse_package("example.com/v9", {"types.go": source})
    with pytest.raises(generator.GoTypeError, match=re.escape("example.com/other.Thing is not known")):
        generator.Translator({}).resolve(package, "Config")
