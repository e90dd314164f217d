"""contrib/kubernetes/: the manifests are valid objects of a named Kubernetes version (kubernetes-validate, strict:
no field the API does not have), the node-problem-detector plugin config has NPD's field names only and passes
the checks NPD makes when it loads one, and its rule runs this package's health check within NPD's timeout."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pytest_gbvalidate.fleet.commands import FAULT_KEY
from pytest_gbvalidate.healthcheck.cli import build_parser
from pytest_gbvalidate.healthcheck.level_run import KILL_GRACE_S
from tests.helpers.runs import REPO

pytestmark = pytest.mark.outside

KUBERNETES_VERSION = "1.33.0"
CONTRIB = REPO / "contrib" / "kubernetes"
PLUGIN_CONFIG = CONTRIB / "gbvalidate-plugin-monitor.json"
MANIFEST = CONTRIB / "gbvalidate-npd.yaml"

# NPD's config structs, by their JSON names (github.com/kubernetes/node-problem-detector at 6632ca67):
# pkg/custompluginmonitor/types/config.go CustomPluginConfig and pluginGlobalConfig, types/types.go CustomRule,
# pkg/types/types.go Condition.
CONFIG_FIELDS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
PLUGIN_CONFIG_FIELDS = {
    "invoke_interval",
    "timeout",
    "max_output_length",
    "concurrency",
    "enable_message_change_based_condition_update",
    "skip_initial_status",
}
RULE_FIELDS = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
CONDITION_FIELDS = {"type", "status", "transition", "reason", "message"}
# Go's time.ParseDuration units.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_s(text: str) -> float:
    assert re.fullmatch(f"(?:{_DURATION.pattern})+", text), f"{text!r} is no Go duration"
    return sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION.findall(text))


def manifests() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc is not None]


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind]
    return doc


def test_the_manifests_are_valid_objects_of_the_kubernetes_version() -> None:
    docs = manifests()
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRoleBinding", "ConfigMap", "DaemonSet"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    # and the validator does fail what the API would refuse: a misspelled field, a wrong type
    misspelled = copy.deepcopy(by_kind("DaemonSet"))
    misspelled["spec"]["template"]["spec"]["tolerationz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelled, KUBERNETES_VERSION, strict=True)
    mistyped = copy.deepcopy(by_kind("DaemonSet"))
    mistyped["spec"]["template"]["spec"]["containers"][0]["command"] = "node-problem-detector"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(mistyped, KUBERNETES_VERSION, strict=True)


def test_the_plugin_config_has_npds_field_names_only() -> None:
    config = json.loads(PLUGIN_CONFIG.read_text())
    assert set(config) <= CONFIG_FIELDS and {"plugin", "source", "conditions", "rules"} <= set(config)
    assert set(config["pluginConfig"]) <= PLUGIN_CONFIG_FIELDS
    assert all(set(rule) <= RULE_FIELDS for rule in config["rules"])
    assert all(set(condition) <= CONDITION_FIELDS for condition in config["conditions"])


def test_the_plugin_config_passes_npds_own_checks() -> None:
    """CustomPluginConfig.ApplyConfiguration and Validate: the custom plugin, durations Go parses, a positive
    interval, no rule timeout above the global one, a default condition for each permanent rule."""
    config = json.loads(PLUGIN_CONFIG.read_text())
    assert config["plugin"] == "custom"
    global_timeout_s = go_duration_s(config["pluginConfig"]["timeout"])
    assert go_duration_s(config["pluginConfig"]["invoke_interval"]) > 0
    conditions = {c["type"] for c in config["conditions"]}
    for rule in config["rules"]:
        assert rule["type"] in ("temporary", "permanent")
        assert go_duration_s(rule["timeout"]) <= global_timeout_s
        assert rule["type"] == "temporary" or rule["condition"] in conditions


def test_the_rule_runs_the_health_check_within_npds_timeout() -> None:
    config = json.loads(PLUGIN_CONFIG.read_text())
    (rule,) = config["rules"]
    assert rule["path"] == "/usr/bin/python3" and rule["args"][:2] == ["-m", "pytest_gbvalidate.healthcheck"]
    args = build_parser().parse_args(rule["args"][2:])  # the command line's own parser
    assert args.mode == "npd" and args.max_output_length == config["pluginConfig"]["max_output_length"]
    # the deadline and SIGTERM's grace, with room for the line, end before NPD kills the plugin (Unknown, no line)
    assert args.deadline_s + KILL_GRACE_S + 10 <= go_duration_s(rule["timeout"])
    assert go_duration_s(rule["timeout"]) < go_duration_s(config["pluginConfig"]["invoke_interval"])


def test_the_daemonset_runs_npd_with_the_configmaps_plugin_config_on_gpu_nodes() -> None:
    config_map, daemon_set = by_kind("ConfigMap"), by_kind("DaemonSet")
    ((key, text),) = config_map["data"].items()
    assert json.loads(text) == json.loads(PLUGIN_CONFIG.read_text())  # the file beside it says the same

    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert f"--config.custom-plugin-monitor={mount['mountPath']}/{key}" in container["command"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"  # NPD's node
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), (FAULT_KEY, "NoSchedule")} <= tolerated
    assert pod["serviceAccountName"] == by_kind("ServiceAccount")["metadata"]["name"]
    assert by_kind("ClusterRoleBinding")["roleRef"]["name"] == "system:node-problem-detector"
