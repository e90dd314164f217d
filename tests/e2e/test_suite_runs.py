"""End-to-end runs of the data movement and collectives machinery through pytester: settings errors, per-GPU
test cases, the NCCL environment the ranks get, reports under a torchrun / srun world, the busbw plot."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # imported here too: in-process pytester runs drop modules they imported, torch cannot load twice

from pytest_gbvalidate.report import node_verdict
from tests.helpers.runs import REPO, SUITES, assert_usage_error, junit_cases

LAB = """\
schema_version: 1
sku: LAB
description: a CPU-only lab SKU for the plugin's tests
detect: {gpu_count: 0}
metrics:
  all_reduce_busbw_gbps:
    unit: GB/s
    direction: higher
    scope: message_size
    status: provisional
    fail: 10%
    params: {nccl_env: {NCCL_ALGO: Ring, NCCL_IB_HCA: mlx5}}
    provenance: the plugin's tests
    values:
      1MiB: {expected: 100}
      4MiB: {expected: 100}
  host_copy_bandwidth_gbps: {unit: GB/s, direction: higher, scope: node, status: provisional, expected: 10,
                             fail: 1, provenance: the plugin's tests}
"""


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(LAB)
    return pytester


ARGS = ["--gb-sku=LAB", "--gb-baselines=baselines", "--junitxml=r.xml", "--gb-report=r.json"]


def suite_properties(path: Path) -> dict[str, str | None]:
    root = ET.parse(path).getroot()
    return {p.get("name", ""): p.get("value") for p in root.iterfind("testsuite/properties/property")}


# --- settings ---------------------------------------------------------------------------------------------------


def test_a_bad_timeout_is_a_usage_error_naming_its_source(pytester: pytest.Pytester) -> None:
    assert_usage_error(
        pytester.runpytest("--gb-timeout=0"),
        "ERROR: --gb-timeout on the command line: '0': a timeout is a number of seconds from 1 to 604800 (a week)",
    )
    pytester.makeini("[pytest]\ngb_timeout = soon\n")
    assert_usage_error(pytester.runpytest(), "ERROR: gb_timeout in *tox.ini: 'soon': a timeout is a number of seconds*")


def test_the_timeout_and_its_source_are_reported(lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GBVALIDATE_TIMEOUT", "7.5")
    lab.makepyfile("def test_x(gb_expect):\n    gb_expect('host_copy_bandwidth_gbps', 11.0)\n")
    lab.runpytest(*ARGS).assert_outcomes(passed=1)
    settings = json.loads((lab.path / "r.json").read_text())["settings"]
    assert settings["timeout"] == {"value": 7.5, "source": "GBVALIDATE_TIMEOUT in the environment"}


def test_conflicting_nccl_environments_are_a_usage_error(lab: pytest.Pytester) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_text(
        path.read_text().replace(
            "fail: 1, provenance", "fail: 1, params: {nccl_env: {NCCL_ALGO: Tree}},\n    provenance"
        )
    )
    assert_usage_error(
        lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"),
        "ERROR: bad baseline: *LAB.yaml: metrics.host_copy_bandwidth_gbps.params.nccl_env.NCCL_ALGO: 'Tree' conflicts "
        "with 'Ring' asked for by metrics.all_reduce_busbw_gbps",
    )


def test_a_malformed_nccl_environment_names_file_line_and_field(lab: pytest.Pytester) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_text(path.read_text().replace("NCCL_IB_HCA: mlx5", "IB_HCA: mlx5"))
    assert_usage_error(
        lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"),
        "ERROR: bad baseline: *LAB.yaml:12: metrics.all_reduce_busbw_gbps.params.nccl_env.IB_HCA: must be an NCCL_* *",
    )


# --- the ranks get the SKU's NCCL environment; the reports say what it was -------------------------------------


def test_the_nccl_environment_is_applied_to_the_ranks_and_reported(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_1")  # the operator's word beats the baseline's
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    lab.makepyfile(
        """
        from tests.helpers import gang_functions as f
        def test_ranks(gb_gang):
            envs = gb_gang.run(f.nccl_environment)
            assert [e.get("NCCL_ALGO") for e in envs] == ["Ring", "Ring"]
            assert [e.get("NCCL_IB_HCA") for e in envs] == ["mlx5_1", "mlx5_1"]
            assert [e.get("NCCL_DEBUG") for e in envs] == ["WARN", "WARN"]
        """
    )
    lab.runpytest(*ARGS).assert_outcomes(passed=1)
    report = json.loads((lab.path / "r.json").read_text())
    assert report["nccl_env"] == {
        "NCCL_ALGO": {"value": "Ring", "source": "baseline LAB (all_reduce_busbw_gbps params)"},
        "NCCL_IB_HCA": {"value": "mlx5_1", "source": "environment (the baseline asks for mlx5)"},
        "NCCL_DEBUG": {"value": "WARN", "source": "environment"},
    }
    assert report["gang"] == {
        **{"kind": "local", "world_size": 2, "device_type": "cpu", "failed_starts": []},
        **{"nodes": 1, "hosts": [{"node_rank": 0, "hostname": socket.gethostname()}]},
    }
    props = suite_properties(lab.path / "r.xml")
    assert (props["gb_NCCL_ALGO"], props["gb_NCCL_IB_HCA"], props["gb_NCCL_DEBUG"]) == ("Ring", "mlx5_1", "WARN")


# --- under torchrun / srun, one rank writes the reports --------------------------------------------------------

CHECK = "def test_x(gb_expect):\n    gb_expect('host_copy_bandwidth_gbps', 11.0)\n"


# A world's rendezvous, as torchrun sets it and an srun script exports it: checked before any test (none is made
# here: the check needs no gang).
RENDEZVOUS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("env", "writes"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, False),
        ({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}, False),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, True),
    ],
)
def test_only_global_rank_0_writes_the_reports(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], writes: bool
) -> None:
    for name, value in (env | RENDEZVOUS).items():
        monkeypatch.setenv(name, value)
    lab.makepyfile(CHECK)
    lab.runpytest(*ARGS).assert_outcomes(passed=1)
    assert (lab.path / "r.json").exists() is writes
    assert (lab.path / "r.xml").exists() is writes
    if writes:
        assert json.loads((lab.path / "r.json").read_text())["world"] == {"world_size": 2}


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "ERROR: MASTER_ADDR and MASTER_PORT not set: "),
        ({"RANK": "0", "WORLD_SIZE": "2"} | RENDEZVOUS, "ERROR: RANK=0 and WORLD_SIZE=2 are set without LOCAL_RANK"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"} | RENDEZVOUS | {"MASTER_PORT": "29500/tcp"},
            "ERROR: MASTER_PORT='29500/tcp' is no port (a whole number from 1 to 65535): the launcher's setting",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"} | RENDEZVOUS | {"MASTER_ADDR": "node-0.invalid"},
            "ERROR: MASTER_ADDR='node-0.invalid' does not resolve to an address on this node",
        ),
    ],
    ids=["no-rendezvous", "no-local-rank", "port-no-number", "address-unresolvable"],
)
def test_a_world_its_launcher_left_incomplete_is_a_usage_error_before_any_test(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
) -> None:
    """Each was a test failed on the node (`unclassified`, exit 1), or every rank measuring the node at once."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lab.makepyfile(CHECK)
    result = lab.runpytest(*ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().startswith(said) and "Traceback" not in result.stderr.str()


GANG_CHECK = "def test_x(gb_gang):\n    assert gb_gang.world_size == 2\n"


def held_port() -> socket.socket:
    """A port another program holds: it accepts connections (the kernel's backlog) and never answers."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(8)
    return holder


@pytest.fixture
def environ_kept() -> Iterator[None]:
    """This process's environment as it was: a rank that got as far as its NCCL settings sets them here (in-process
    pytester run) for the ranks it would start."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("rank", ["1", "0"], ids=["client-rank", "rank-0"])
@pytest.mark.usefixtures("environ_kept")
def test_a_rendezvous_port_another_program_holds_is_the_launcher_s_usage_error_within_the_timeout(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    """A client rank sat ten minutes in torch's handshake with the holder, whatever --gb-timeout said; rank 0,
    which makes the store there, failed the node's first gang test `unclassified`."""
    with held_port() as holder:
        port = str(holder.getsockname()[1])
        env = {"RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank} | RENDEZVOUS | {"MASTER_PORT": port}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        lab.makepyfile(GANG_CHECK)
        result = lab.runpytest(*ARGS, "--gb-timeout=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = (
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} accepted a connection but no torch store answered within 2 s"
        if rank == "1"
        else f"MASTER_PORT={port} is in use on this node by another program"
    )
    assert said in result.stdout.str() and "the launcher's failure: no verdict on this node" in result.stdout.str()
    if rank == "0":
        assert node_verdict.of_report(json.loads((lab.path / "r.json").read_text())) == node_verdict.NO_VERDICT


def test_a_rank_waiting_on_a_held_rendezvous_port_ends_on_sigterm(lab: pytest.Pytester) -> None:
    """It ignored SIGTERM while torch's handshake held it: scancel could not end it."""
    lab.makepyfile(GANG_CHECK)
    with held_port() as holder:
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"} | RENDEZVOUS
        env |= {"MASTER_PORT": str(holder.getsockname()[1]), "PYTHONPATH": str(REPO)}
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", *ARGS, "--gb-timeout=300", "-p", "no:cacheprovider"],
            cwd=lab.path,
            env=os.environ | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            holder.settimeout(90)
            holder.accept()[0].close()  # the rank is in its handshake now
            sent = time.monotonic()
            run.send_signal(signal.SIGTERM)
            out, _ = run.communicate(timeout=30)
        finally:
            run.kill()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert time.monotonic() - sent < 20, out


def test_an_unrelated_suite_under_torchrun_keeps_its_junit_on_every_rank(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest("--junitxml=r.xml").assert_outcomes(passed=1)
    assert (pytester.path / "r.xml").exists()


# --- the plot -------------------------------------------------------------------------------------------------

SWEEP = """\
from pytest_gbvalidate.expect import Measured

def test_sweep(gb_expect):
    for size, label in ((2**20, "1MiB"), (2**21, "2MiB"), (2**22, "4MiB")):
        details = {"collective": "all_reduce", "placement": "in_place", "size_bytes": size, "wrong": 0}
        if label == "2MiB":
            gb_expect.record("all_reduce_busbw_gbps", 95.0, label, details=details)
        else:
            gb_expect.each([Measured("all_reduce_busbw_gbps", 99.0, label, details)])
"""


def test_without_matplotlib_the_plot_is_left_out_quietly(lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    lab.makepyfile(SWEEP)
    result = lab.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if "busbw plot" in line]  # nothing went wrong: nothing to say
    report = json.loads((lab.path / "r.json").read_text())
    assert "plots" not in report
    assert report["plot_note"] == "busbw plot: needs matplotlib (pip install 'pytest-gbvalidate[plots]')"
    assert [(m["scope"], m["verdict"]) for m in report["measurements"]] == [
        ("1MiB", "pass"),
        ("2MiB", "info"),
        ("4MiB", "pass"),
    ]
    assert not list(lab.path.glob("*.png"))


def test_each_reports_every_failure_in_one_message(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        """
        from pytest_gbvalidate.expect import Measured

        def test_many(gb_expect):
            gb_expect.each([
                Measured("all_reduce_busbw_gbps", 50.0, "1MiB", {}),
                Measured("all_reduce_busbw_gbps", 50.0, "2MiB", {}),  # no reference: would skip on its own
                Measured("all_reduce_busbw_gbps", 60.0, "4MiB", {}),
            ])
        def test_one_unreferenced(gb_expect):
            unreferenced = Measured("all_reduce_busbw_gbps", 50.0, "2MiB", {})
            gb_expect.each([unreferenced, Measured("host_copy_bandwidth_gbps", 9.0, "node", {})])
        def test_the_old_order(gb_expect):
            gb_expect.each([("host_copy_bandwidth_gbps", "node", 9.0, {})])
        """
    )
    result = lab.runpytest(*ARGS)
    result.assert_outcomes(failed=2, passed=1)  # a gate that passed is not hidden by a measurement without one
    assert (
        "TypeError: gb_expect.each takes Measured(metric, value, scope, details), not ('host_copy_bandwidth_gbps',"
        in result.stdout.str()
    )
    message = junit_cases(lab.path / "r.xml")["test_many"]["message"] or ""
    assert "[1MiB]: measured 50 GB/s" in message and "[4MiB]: measured 60 GB/s" in message
    verdicts = [m["verdict"] for m in json.loads((lab.path / "r.json").read_text())["measurements"]]
    assert verdicts == ["fail", "skip", "fail", "skip", "pass"]


# --- one case per GPU the SKU promises -----------------------------------------------------------------------


def lab_gpu(pytester: pytest.Pytester, gpu_count: int) -> None:
    (pytester.path / "baselines").mkdir(exist_ok=True)
    (pytester.path / "baselines" / "LABGPU.yaml").write_text(
        f"schema_version: 1\nsku: LABGPU\ndetect: {{gpu_count: {gpu_count}}}\nmetrics: {{}}\n"
    )


def test_per_gpu_cases_come_from_the_sku_not_the_node(pytester: pytest.Pytester) -> None:
    lab_gpu(pytester, 3)
    result = pytester.runpytest(
        str(SUITES / "test_bandwidth.py"), "--gb-sku=LABGPU", "--gb-baselines=baselines", "--co", "-q"
    )
    result.stdout.fnmatch_lines(
        [
            "*test_h2d_bandwidth[[]gpu0[]]",
            "*test_h2d_bandwidth[[]gpu2[]]",
            "*test_p2p_bandwidth[[]gpu0->gpu1[]]",
            "*test_p2p_bandwidth[[]gpu2->gpu1[]]",
            "*test_gemm_fp8_tflops[[]gpu2[]]",
        ]
    )
    assert sum("test_p2p_bandwidth[" in line for line in result.stdout.lines) == 6


@pytest.mark.usefixtures("cpu_only_node")
def test_a_gpu_sku_without_its_gpus_fails_once_for_the_cause_and_runs_none_of_its_gpu_checks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a node without GPUs or driver, a SKU promising two fails once, naming NVML's error (not each check on
    its own, each starting its ranks twice); [gpu0] and [gpu1] are not run, saying why -- never a silent skip: the
    run fails."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # nor does CUDA see one, on a GPU host too (the ranks inherit it)
    lab_gpu(pytester, 2)
    args = [str(SUITES / "test_bandwidth.py"), "--gb-sku=LABGPU", "--gb-baselines=baselines", "--junitxml=r.xml"]
    result = pytester.runpytest(*args, "-k", "h2d and not siblings", "--html=node.html", "--self-contained-html")
    result.assert_outcomes(failed=1, skipped=2)
    # the page has the failed check's row, as every other output: not "0 Failed" under a FAIL badge
    page = (pytester.path / "node.html").read_text()
    blob = json.loads(html.unescape(re.search(r'data-jsonblob="([^"]*)"', page)[1]))  # type: ignore[index]
    rows = {test["testId"]: test["result"] for tests in blob["tests"].values() for test in tests}
    assert rows["gbvalidate::node_gpus_usable"] == "Failed"
    cases = junit_cases(pytester.path / "r.xml")
    root = cases["node_gpus_usable"]
    assert root["outcome"] == "failure" and "the node's GPUs cannot be used: NVML does not load: " in root["message"]
    why = "not run: the node's GPUs cannot be used (NVML does not load: "
    for case in (cases["test_h2d_bandwidth[gpu0]"], cases["test_h2d_bandwidth[gpu1]"]):
        assert case["outcome"] == "skipped" and (case["message"] or "").startswith(why)
    assert "start-up" not in result.stdout.str()  # no ranks were started


def test_where_torch_sees_none_of_the_gpus_nvml_lists_only_the_checks_on_the_ranks_are_not_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A GB200 node whose driver answers and whose torch sees no GPU (a CPU build, a CUDA runtime newer than the
    driver, CUDA_VISIBLE_DEVICES): the checks that read NVML run and pass; those that start ranks on the GPUs are
    not run; the run fails once, in the fault category `software`."""
    from tests.helpers.fakenode import nd_gb200_v6

    nd_gb200_v6().install(monkeypatch, tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    args = [str(SUITES / "test_bandwidth.py"), str(SUITES / "test_health.py"), "--gb-sku=ND_GB200_v6"]
    result = pytester.runpytest(*args, "--junitxml=r.xml", "--gb-report=r.json", "-k", "h2d or gpu_count")
    cases = junit_cases(pytester.path / "r.xml")
    assert {n: c["outcome"] for n, c in cases.items() if "h2d" not in n} == {
        "test_gpu_count": "passed",
        "node_gpus_usable": "failure",
    }, result.stdout.str()
    assert all(c["outcome"] == "skipped" for n, c in cases.items() if "h2d" in n)
    report = json.loads((pytester.path / "r.json").read_text())
    (root,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert "torch sees none of the 4 GPUs NVML lists (torch " in root["message"]
    assert root["fault"]["category"] == "software"


@pytest.mark.parametrize(
    ("sku", "torch_gpus", "why", "category", "health"),
    [
        (
            "ND_GB200_v6",
            3,
            "only 3 of the 4 GPUs ND_GB200_v6 promises are there (NVML lists 4, torch sees 3; torch ",
            "gpu_hardware",
            {"test_gpu_count": "passed", "test_gpu_model": "passed"},
        ),
        (
            "ND_H100_v5",
            4,
            "they are 'NVIDIA GB200', not ND_H100_v5's ('H100 80GB HBM3' in the name)",
            "configuration",
            {"test_gpu_count": "failure", "test_gpu_model": "failure"},
        ),
    ],
    ids=["a-gpu-missing-to-torch", "another-sku-s-gpus"],
)
def test_a_gpu_missing_or_gpus_of_another_model_fail_once_and_start_no_ranks(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sku: str,
    torch_gpus: int,
    why: str,
    category: str,
    health: dict[str, str],
) -> None:
    """A GB200 node of which torch sees 3 GPUs (the gang starts one rank per GPU the SKU promises), and the same node
    checked as an H100 one (its figures judged against another GPU's baseline): one root failure naming the cause,
    in its fault category; the checks that start ranks or judge a figure against the baseline are not run; the
    health checks run and say what else is wrong."""
    from tests.helpers.fakenode import nd_gb200_v6

    nd_gb200_v6().install(monkeypatch, tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: torch_gpus)
    args = [str(SUITES / "test_bandwidth.py"), str(SUITES / "test_health.py"), f"--gb-sku={sku}"]
    pytester.runpytest(*args, "--junitxml=r.xml", "--gb-report=r.json", "-k", "h2d or gpu_count or gpu_model")
    cases = junit_cases(pytester.path / "r.xml")
    assert {n: c["outcome"] for n, c in cases.items() if "h2d" not in n} == health | {"node_gpus_usable": "failure"}
    h2d = [c for n, c in cases.items() if "h2d" in n]
    assert h2d and all(c["outcome"] == "skipped" and why in (c["message"] or "") for c in h2d)
    report = json.loads((pytester.path / "r.json").read_text())
    (root,) = [t for t in report["tests"] if t["test_id"] == "gbvalidate::node_gpus_usable"]
    assert root["message"].startswith(f"the node's GPUs cannot be used: {why}")
    assert root["fault"]["category"] == category


def test_a_baseline_that_gates_nothing_gives_no_verdict_not_a_pass(pytester: pytest.Pytester) -> None:
    """A site's baseline without the metrics its checks measure: every check skipped. That run exited 0 -- a gate
    that measured nothing passed; it is no verdict now (pytest's "nothing ran", 5), in the report too."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "EMPTY.yaml").write_text(
        "schema_version: 1\nsku: EMPTY\ndetect: {gpu_count: 0}\nmetrics: {}\n"
    )
    args = ["--gb-sku=EMPTY", "--gb-baselines=baselines", "--gb-report=r.json", "-k", "host_copy"]
    result = pytester.runpytest(str(SUITES / "test_bandwidth.py"), *args)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*no check ran: every selected check was skipped * no verdict (exit 5), never a pass"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["exit_status"] == 5 and node_verdict.of_report(report) == node_verdict.NO_VERDICT
    assert report["narrowed_by"] == ["-k 'host_copy'"]  # a subset: it speaks for the node only after no whole run


# --- sweep sizes that were not run ------------------------------------------------------------------------------

NOT_RUN_CHECK = """
from pytest_gbvalidate.sweeps import expect_sweep, sweep_plan

def test_sweep(gb_target, gb_expect):
    plan = sweep_plan(gb_target, "all_reduce_busbw_gbps")  # gates 1MiB and 4MiB
    base = {"collective": "all_reduce", "placement": "in_place", "dtype": "float"}
    rows = [
        ("1MiB", 101.0, base | {"size_bytes": 2**20, "count": 2**18, "time_us": 10.4, "algbw_gbps": 101.0,
                                "wrong": 0}),
        ("2MiB", float("nan"), base | {"size_bytes": 2**21, "count": 2**19, "not_run": "memory: needs 14 MiB"}),
        ("4MiB", float("nan"), base | {"size_bytes": 2**22, "count": 2**20, "not_run": "memory: needs 16 MiB"}),
    ]
    expect_sweep(gb_expect, "all_reduce_busbw_gbps", plan, rows)
"""


def test_a_gated_size_not_run_fails_and_an_ungated_one_is_listed(lab: pytest.Pytester) -> None:
    lab.makepyfile(test_sweep=NOT_RUN_CHECK)
    result = lab.runpytest(*ARGS, "-v")  # -v: the per-size tables too
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*all_reduce_busbw_gbps at 4MiB: not run (memory: needs 16 MiB)"])
    result.stdout.fnmatch_lines(
        [
            "*gbvalidate: collectives, per message size (nccl-tests columns)*",
            "*1MiB*262144*float*10.4*101*0*PASS (expected 100)",
            "*2MiB*524288*float*not run (memory)*-*-*-*",
            "*4MiB*1048576*float*not run (memory)*-*-*-*FAIL",
        ]
    )
    report = json.loads((lab.path / "r.json").read_text())
    by_scope = {m["scope"]: m for m in report["measurements"]}
    assert [(s, by_scope[s]["value"], by_scope[s]["verdict"]) for s in ("1MiB", "2MiB", "4MiB")] == [
        ("1MiB", 101.0, "pass"),
        ("2MiB", None, "info"),
        ("4MiB", None, "fail"),
    ]
    assert by_scope["4MiB"]["message"] == "not run: memory: needs 16 MiB"
    assert junit_cases(lab.path / "r.xml")["test_sweep"]["outcome"] == "failure"
