"""contrib/prometheus/ against the real programs (Debian's `prometheus` and `prometheus-node-exporter`): promtool
checks the rules and runs their unit tests, every alert is tested firing and not firing there, and a real
Prometheus, scraping a real node_exporter per node that serves the file a real run of the plugin wrote, fires the
failed-gate alert for the failed node alone (our own failure gets its own alert; the healthy node none) and holds
its failed check's fault category, which the NVLink domain rule counts. (The metrics themselves:
unit/test_prometheus.py.)"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.helpers.runs import LAB, REPO, lab_project
from tests.helpers.slurm import free_ports

pytestmark = pytest.mark.outside

CONTRIB = REPO / "contrib" / "prometheus"
RULES = CONTRIB / "gbvalidate.rules.yml"
RULES_TEST = CONTRIB / "gbvalidate.rules.test.yml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in rules() if "alert" in rule]


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_s_unit_tests_of_the_rules_pass() -> None:
    """gbvalidate.rules.test.yml: each alert's labels and expanded annotations, firing and not, and the recording
    rules' values."""
    assert PROMTOOL is not None
    command = [PROMTOOL, "test", "rules", RULES_TEST.name]
    result = subprocess.run(command, cwd=CONTRIB, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


_LABEL = re.compile(r'(\w+)="([^"]*)"')
# The alerts about an NVLink domain rather than a node.
BY_DOMAIN = {"GbvalidateNvlinkDomainFabricFailing": "nvlink_domain"}


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    """Each alert of the rules has a test where it fires and one where, on input of its own test group, it does not
    fire for some node (an `instance`) or NVLink domain the series hold: an alert whose every test fires, or one
    never tested, fails here."""
    spec = yaml.safe_load(RULES_TEST.read_text())
    assert spec["rule_files"] == [RULES.name]
    fired: dict[str, bool] = dict.fromkeys(alert_names(), False)
    spared: dict[str, bool] = dict.fromkeys(alert_names(), False)
    for group in spec["tests"]:
        present = set()
        for series in group["input_series"]:
            labels = dict(_LABEL.findall(series["series"]))
            present |= {(key, labels[key]) for key in ("instance", "nvlink_domain") if key in labels}
        for case in group.get("alert_rule_test", []):
            name = case["alertname"]
            assert name in fired, f"{name} is no alert of {RULES.name}"
            expected = case.get("exp_alerts") or []
            fired[name] |= bool(expected)
            key = BY_DOMAIN.get(name, "instance")
            firing = {(key, a["exp_labels"][key]) for a in expected}
            spared[name] |= bool({p for p in present if p[0] == key} - firing)
    assert [name for name, seen in fired.items() if not seen] == []
    assert [name for name, seen in spared.items() if not seen] == []


def test_every_alert_has_a_severity_and_says_which_node_and_what_to_do() -> None:
    for rule in rules():
        if "alert" not in rule:
            assert re.fullmatch(r"[a-z_]+:gbvalidate_[a-z_]+:[a-z_0-9]+", rule["record"]), rule["record"]
            continue
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        subject = "$labels.nvlink_domain" if rule["alert"] in BY_DOMAIN else "$labels.hostname"
        assert all(subject in text for text in rule["annotations"].values()), rule["alert"]


# The lab SKU's host copy check (expected 100 GB/s, fail below 50%), measuring what the node's variable says.
CHECKS = """\
import os

def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", float(os.environ["LAB_COPY_GBPS"]))
"""


@dataclass(frozen=True)
class Node:
    """A node's directory for node_exporter's textfile collector, the file a run wrote there, and how the run
    ended."""

    name: str
    directory: Path
    exit_code: int


@pytest.fixture
def nodes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> dict[str, Node]:
    """Three runs of the plugin (in-process pytester runs: under a second for the three here), each writing its
    node's file with --gb-prometheus: a healthy node, a node whose check fails, and our own failure (a -k that
    selects nothing: pytest's exit status 5, no verdict)."""
    lab_project(pytester, LAB, CHECKS)
    found = {}
    for name, gbps, extra in (("healthy", "101", ()), ("failed", "10", ()), ("own", "101", ("-k", "no_such_check"))):
        monkeypatch.setenv("LAB_COPY_GBPS", gbps)
        directory = pytester.path / "nodes" / name
        args = ["--gb-sku=LAB", "--gb-baselines=baselines", f"--gb-prometheus={directory}/gbvalidate.prom", *extra]
        result = pytester.runpytest(*args, "-p", "no:cacheprovider")
        assert (directory / "gbvalidate.prom").is_file(), result.stdout.str()
        found[name] = Node(name, directory, int(result.ret))
    assert [n.exit_code for n in found.values()] == [0, 1, 5]
    return found


T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], deadline: float, logs: Callable[[], str]) -> T:
    """`probe()` once it is not None, polled until `deadline` (time.monotonic()); else fail saying what and the
    programs' logs."""
    while True:
        try:
            found = probe()
        except OSError:  # not listening yet, or a request that timed out
            found = None
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.2)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())["data"]


def rfc3339(text: str) -> dt.datetime:
    """Prometheus's times (nanoseconds, `Z`) as Python reads them."""
    text = re.sub(r"(\.\d{6})\d*", r"\1", text).replace("Z", "+00:00")
    return dt.datetime.fromisoformat(text)


@dataclass
class Programs:
    processes: list[tuple[str, subprocess.Popen[bytes], Path]]

    def logs(self) -> str:
        return "\n".join(f"--- {name}:\n{log.read_text(errors='replace')[-3000:]}" for name, _, log in self.processes)


@pytest.fixture
def programs(tmp_path: Path) -> Iterator[Programs]:
    """The processes a test starts (their logs in tmp_path), ended after it, whatever happened."""
    started = Programs([])
    try:
        yield started
    finally:
        for _, process, _ in started.processes:
            process.terminate()
        for _, process, _ in started.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def start(programs: Programs, name: str, command: list[str], log: Path) -> None:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    programs.processes.append((name, process, log))


@pytest.mark.skipif(PROMETHEUS is None, reason="Prometheus not installed (apt-get install prometheus)")
@pytest.mark.skipif(
    NODE_EXPORTER is None, reason="node_exporter not installed (apt-get install prometheus-node-exporter)"
)
def test_prometheus_fires_the_failed_gate_for_the_failed_node_alone(
    nodes: dict[str, Node], programs: Programs, tmp_path: Path
) -> None:
    assert PROMETHEUS is not None and NODE_EXPORTER is not None
    *exporter_ports, port = free_ports(len(nodes) + 1)
    instances = {}
    for (name, node), exporter_port in zip(nodes.items(), exporter_ports, strict=True):
        command = [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile"]
        command += [
            f"--collector.textfile.directory={node.directory}",
            f"--web.listen-address=127.0.0.1:{exporter_port}",
        ]
        start(programs, f"node_exporter {name}", command, tmp_path / f"node_exporter-{name}.log")
        instances[f"127.0.0.1:{exporter_port}"] = name
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": list(instances)}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
    command += [f"--web.listen-address=127.0.0.1:{port}"]
    start(programs, "prometheus", command, tmp_path / "prometheus.log")
    api = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 20

    def all_up() -> float | None:
        targets = get(f"{api}/targets?state=active")["activeTargets"]
        up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
        return time.time() if up == set(instances) else None

    scraped = wait_for("every node_exporter scraped", all_up, deadline, programs.logs)

    def evaluated_after_the_scrapes() -> bool | None:
        (group,) = [g for g in get(f"{api}/rules")["groups"] if g["name"] == "gbvalidate"]
        return True if rfc3339(group["lastEvaluation"]).timestamp() > scraped else None

    wait_for("the rules evaluated on every node's series", evaluated_after_the_scrapes, deadline, programs.logs)
    alerts = get(f"{api}/alerts")["alerts"]
    firing = sorted(
        (a["labels"]["alertname"], instances[a["labels"]["instance"]]) for a in alerts if a["state"] == "firing"
    )
    assert firing == [("GbvalidateGateFailed", "failed"), ("GbvalidateRunNoVerdict", "own")], programs.logs()
    (failed,) = [a for a in alerts if a["labels"]["alertname"] == "GbvalidateGateFailed"]
    assert failed["labels"]["severity"] == "critical" and failed["labels"]["sku"] == "LAB"
    assert "test_checks.py::test_copy" in failed["annotations"]["description"]  # the failed check, named
    (own,) = [a for a in alerts if a["labels"]["alertname"] == "GbvalidateRunNoVerdict"]
    assert own["labels"]["severity"] == "warning"
    assert "(`no verdict`, pytest's exit status 5)" in own["annotations"]["description"]
    # The failed check's fault category, as the domain rule reads it: through node_exporter, the failed node's only.
    faults = get(f"{api}/query?query=gbvalidate_test_fault")["result"]
    assert [(instances[f["metric"]["instance"]], f["metric"]["test"], f["value"][1]) for f in faults] == [
        ("failed", "test_checks.py::test_copy", "1")
    ], faults
    assert faults[0]["metric"]["category"] == "performance"
