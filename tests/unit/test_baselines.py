"""Unit tests of the baseline schema, loading, comparison and recording (pure module, no pytest run)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.metrics import CATALOG
from pytest_gbvalidate.settings import bundled_baselines
from tests.helpers.baseline_files import GOOD, SECTIONS, write
from tests.helpers.runs import REPO


def test_every_bundled_baseline_loads_and_names_its_file() -> None:
    loaded = bl.load_all(bundled_baselines())
    assert {b.sku for b in loaded} >= {"cpu", "ND_GB200_v6", "ND_H100_v5", "ND_H200_v5", "ND96asr_v4"}
    for b in loaded:
        assert b.path.stem == b.sku
        for metric in b.metrics.values():
            for ref in (metric.default, *metric.values.values()):
                assert ref.provenance or metric.values, f"{b.sku}:{ref.metric} has no provenance"


def test_bundled_gpu_baselines_are_provisional_public_figures() -> None:
    # Nothing in them was measured by this project: every value must say so.
    for b in bl.load_all(bundled_baselines()):
        if b.sku == "cpu":
            continue
        statuses = {ref.status for m in b.metrics.values() for ref in (m.default, *m.values.values())}
        assert statuses == {"provisional"}, b.sku


def test_limits_resolve_from_relative_and_absolute(tmp_path: Path) -> None:
    b = bl.load_baseline(write(tmp_path, GOOD))
    h2d = b.metrics["h2d_bandwidth_gbps"].reference("gpu3")
    assert h2d is not None
    assert h2d.fail_limit == pytest.approx(45.0)
    assert h2d.warn_limit == 48.0
    step = b.metrics["step_time_s"].reference("node")
    assert step is not None
    assert step.fail_limit == pytest.approx(2.5)  # lower is better: the limit is above expected
    sizes = b.metrics["all_reduce_busbw_gbps"]
    one = sizes.reference("1GiB")
    assert one is not None and one.fail_limit == pytest.approx(360.0)
    sixteen = sizes.reference("16GiB")
    assert sixteen is not None and sixteen.expected is None and sixteen.fail_limit == 430.0
    assert sizes.reference("8GiB") is None  # a per-size metric has no value for a size it does not list
    assert b.detect == bl.Detect(("Standard_X",), "X1", 2)


@pytest.mark.parametrize(
    ("value", "verdict"),
    [(55.0, "pass"), (50.0, "pass"), (48.0, "pass"), (47.9, "warn"), (45.0, "warn"), (44.9, "fail")],
)
def test_compare_higher_is_better(tmp_path: Path, value: float, verdict: str) -> None:
    ref = bl.load_baseline(write(tmp_path, GOOD)).metrics["h2d_bandwidth_gbps"].reference("gpu0")
    assert ref is not None
    assert bl.compare(ref, value, "gpu0").verdict == verdict


@pytest.mark.parametrize(("value", "verdict"), [(1.0, "pass"), (2.5, "pass"), (2.51, "fail")])
def test_compare_lower_is_better(tmp_path: Path, value: float, verdict: str) -> None:
    ref = bl.load_baseline(write(tmp_path, GOOD)).metrics["step_time_s"].reference("node")
    assert ref is not None
    assert bl.compare(ref, value, "node").verdict == verdict


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_a_number_fails(tmp_path: Path, value: float) -> None:
    ref = bl.load_baseline(write(tmp_path, GOOD)).metrics["step_time_s"].reference("node")
    assert ref is not None
    assert bl.compare(ref, value, "node").verdict == "fail"


def test_verdict_message_triages_itself(tmp_path: Path) -> None:
    ref = bl.load_baseline(write(tmp_path, GOOD)).metrics["h2d_bandwidth_gbps"].reference("gpu3")
    assert ref is not None
    v = bl.compare(ref, 40.0, "gpu3")
    assert v.verdict == "fail"
    assert v.delta_pct == pytest.approx(-20.0)
    msg = v.message
    for part in ("h2d_bandwidth_gbps [gpu3]", "measured 40 GB/s", "expected 50 GB/s", "fail limit 45 GB/s"):
        assert part in msg
    assert "delta -20.0%" in msg and "higher is better" in msg and "FAIL" in msg and "golden node" in msg
    record = v.as_dict()
    assert record["limit"] == 45.0 and record["verdict"] == "fail" and record["delta_pct"] == -20.0


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (
            (
                "    unit: GB/s\n    direction: higher\n    scope: gpu",
                "    unit: GiB/s\n    direction: higher\n    scope: gpu",
            ),
            ":7: metrics.h2d_bandwidth_gbps.unit: unknown unit 'GiB/s'",
        ),
        (
            ("direction: lower", "direction: down"),
            ":17: metrics.step_time_s.direction: 'down' is not one of higher, lower",
        ),
        (("scope: node", "scope: rack"), ":18: metrics.step_time_s.scope: 'rack' is not one of"),
        (("status: measured", "status: guessed"), ":10: metrics.h2d_bandwidth_gbps.status: 'guessed' is not one of"),
        (
            ("    expected: 50\n", "    expected: fast\n"),
            ":11: metrics.h2d_bandwidth_gbps.expected: must be a finite number",
        ),
        (("fail: 10%", "fail: ten%"), ":12: metrics.h2d_bandwidth_gbps.fail: 'ten%': a relative limit"),
        (("fail: 10%", "fail: 150%"), ":12: metrics.h2d_bandwidth_gbps.fail: must be below 100%"),
        (("fail: 10%", "fail: 49"), ":12: metrics.h2d_bandwidth_gbps.fail: 49 is above warn 48"),
        (("    warn: 48\n", "    warn: 51\n"), ":13: metrics.h2d_bandwidth_gbps.warn: 51 is above expected 50"),
        # References are positive: a negative one would pass every measurement (+151% against -10.9).
        (
            ("    expected: 50\n    fail: 10%\n    warn: 48\n", "    expected: -10.9\n    fail: -20\n    warn: -15\n"),
            ":11: metrics.h2d_bandwidth_gbps.expected: -10.9: must be above 0 (a figure in GB/s)",
        ),
        (("    expected: 2.0\n", "    expected: -2.0\n"), ":20: metrics.step_time_s.expected: -2: must be above 0"),
        (("    expected: 50\n", "    expected: 0\n"), ":11: metrics.h2d_bandwidth_gbps.expected: 0: must be above 0"),
        (("    warn: 48\n", "    warn: -48\n"), ":13: metrics.h2d_bandwidth_gbps.warn: -48: must be above 0"),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: -400}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GiB.expected: -400: must be above 0",
        ),
        # ... and strictly ordered: fail < warn < expected (higher is better), expected < fail (lower).
        (
            ("    warn: 48\n", "    warn: 50\n"),
            ":13: metrics.h2d_bandwidth_gbps.warn: 50 equals expected: it must lie below",
        ),
        (("    fail: 25%\n", "    fail: 2.0\n"), ":21: metrics.step_time_s.fail: 2 equals expected: it must lie above"),
        (
            ("      16GiB: {fail: 430,", "      16GiB: {expected: 430, fail: 430,"),
            ":32: metrics.all_reduce_busbw_gbps.values.16GiB.fail: 430 equals expected: it must lie below it",
        ),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: 400, warn: 360}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GiB.fail: 360 equals warn: it must lie below it",
        ),
        (("    provenance: golden node\n", ""), "metrics.h2d_bandwidth_gbps.provenance: must be a non-empty string"),
        (("    fail: 25%\n", ""), "metrics.step_time_s.fail: missing (a metric with an expected value needs a fail"),
        (("    expected: 50\n", ""), "metrics.h2d_bandwidth_gbps.expected: missing (a measured baseline"),
        (
            ("    expected: 2.0\n", "    expected: 2.0\n    expect: 3\n"),
            ":21: metrics.step_time_s.expect: unknown field",
        ),
        (("sku: TEST", "sku: OTHER"), ":2: sku: 'OTHER' does not match the file name 'TEST.yaml'"),
        (("schema_version: 1", "schema_version: 2"), ":1: schema_version: must be 1"),
        (("gpu_count: 2", "gpu_count: two"), "detect.gpu_count: must be an integer from 0 to 64"),
        (("gpu_count: 2", "gpu_count: 100000000"), "detect.gpu_count: must be an integer from 0 to 64"),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: 400}\n      1GiB: {expected: 300}\n"),
            ":32: duplicate key '1GiB'",
        ),
        (
            ("detect: {azure_vm_sizes: [Standard_X], gpu_name_contains: X1, gpu_count: 2}", "detect: [1]"),
            ":4: detect: must be a mapping, got list",
        ),
        # Look-alikes: a Cyrillic letter, a misspelt bundled metric (either would leave the real check ungated),
        # a SKU that reads the same as its file name; and a number no float holds.
        (
            ("  h2d_bandwidth_gbps:\n", "  h2d_bandwidth_gb\u0440s:\n"),
            ":6: metrics.'h2d_bandwidth_gb\\u0440s': a metric name is ASCII letters, digits and '_'",
        ),
        (
            ("  h2d_bandwidth_gbps:\n", "  h2d_bandwith_gbps:\n"),
            ":6: metrics.h2d_bandwith_gbps: is not a bundled metric, and a letter or two away from "
            "'h2d_bandwidth_gbps': misspelt?",
        ),
        (("sku: TEST", "sku: T\u0415ST"), ":2: sku: 'T\\u0415ST' does not match the file name 'TEST.yaml'"),
        (("    expected: 50\n", "    expected: " + "9" * 400 + "\n"), "expected: must be a finite number, got 9999"),
        # A host's identity is its own: one NCCL_HOSTID for a fleet would make NCCL take the nodes for one host.
        (
            ("    provenance: nccl-tests\n", "    provenance: nccl-tests\n    params: {nccl_env: {NCCL_HOSTID: n1}}\n"),
            ":30: metrics.all_reduce_busbw_gbps.params.nccl_env.NCCL_HOSTID: names a node, not a SKU: each node's own "
            "environment sets it, never a baseline",
        ),
    ],
)
def test_schema_errors_name_file_line_and_field(tmp_path: Path, change: tuple[str, str], expected_error: str) -> None:
    old, new = change
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    message = str(excinfo.value)
    assert message.startswith(str(path)), message
    assert expected_error in message, message
    assert "\n" not in message


COUNT = """\
schema_version: 1
sku: TEST
metrics:
  xid_errors:
    unit: count
    direction: lower
    scope: gpu
    status: measured
    expected: 0
    fail: 0
    provenance: none is healthy
"""


def test_a_count_may_be_zero_and_gated_at_its_expected_value(tmp_path: Path) -> None:
    ref = bl.load_baseline(write(tmp_path, COUNT)).metrics["xid_errors"].reference("gpu0")
    assert ref is not None and (ref.expected, ref.fail_limit) == (0.0, 0.0)
    assert [bl.compare(ref, v, "gpu0").verdict for v in (0.0, 1.0)] == ["pass", "fail"]


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (("fail: 0", "fail: -1"), ":10: metrics.xid_errors.fail: -1: must be 0 or more (a count is never negative)"),
        (("expected: 0", "expected: -1"), ":9: metrics.xid_errors.expected: -1: must be 0 or more"),
        (("fail: 0", "fail: 10%"), ":10: metrics.xid_errors.fail: 10%: a percentage of expected 0 is 0; give a number"),
        (
            ("direction: lower", "direction: higher"),
            ":10: metrics.xid_errors.fail: 0: a limit of 0 fails nothing when higher is better",
        ),
    ],
)
def test_count_errors(tmp_path: Path, change: tuple[str, str], expected_error: str) -> None:
    path = write(tmp_path, COUNT.replace(*change))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value).startswith(f"{path}{expected_error}"), excinfo.value


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    unit: s\n", "    unit: [s\n"))
    with pytest.raises(bl.BaselineError, match=r"TEST\.yaml:\d+:\d+: YAML syntax error"):
        bl.load_baseline(path)


def test_a_baseline_that_is_not_utf8_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "TEST.yaml"
    latin1 = GOOD.replace("description: a test SKU", "description: caf\u00e9").encode("latin-1")
    path.write_bytes(latin1)
    offset = latin1.index(b"\xe9")
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == f"{path}:3: not UTF-8 text (byte 0xe9 at offset {offset})"


def test_a_control_character_is_a_one_line_error(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("description: a test SKU", "description: a\x00test SKU"))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == f"{path}:3:15: YAML does not allow the character U+0000"


@pytest.mark.parametrize(
    ("escaped", "shown"),
    [("\\e[2J", "U+001B"), ("\\x9b", "U+009B"), ("\\u202e", "U+202E")],
    ids=["escape", "c1", "direction"],
)
def test_a_control_character_a_quoted_string_spells_is_refused(tmp_path: Path, escaped: str, shown: str) -> None:
    """YAML refuses a raw control character, not one a double-quoted string spells: it would reach the terminal."""
    path = write(tmp_path, GOOD.replace("provenance: golden node", f'provenance: "golden{escaped} node"'))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == (
        f"{path}: metrics.h2d_bandwidth_gbps.provenance holds {shown}: a baseline holds text, not terminal or "
        "direction controls"
    )


def test_yaml_is_never_executed(tmp_path: Path) -> None:
    path = write(tmp_path, "!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(bl.BaselineError, match="could not determine a constructor"):
        bl.load_baseline(path)


def alias_bomb(levels: int) -> str:
    """A "billion laughs" list: each level repeats the one before nine times (9**levels strings in all)."""
    rows = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    rows += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "[" + ", ".join(rows) + "]"


@pytest.mark.parametrize(
    ("old", "field"),
    [
        ("description: a test SKU", "description"),  # str() of it took 54 s and 5.9 GB at 9 levels
        ("unit: s", "unit"),  # echoed in "unknown unit ..."
        ("status: provisional", "status"),  # echoed in "... is not one of ..."
        ("expected: 2.0", "expected"),  # echoed in "must be a finite number, got ..."
    ],
)
def test_an_alias_bomb_is_refused_early(tmp_path: Path, old: str, field: str) -> None:
    # Six levels, so that a loader without the bound still finishes (half a million strings); nine would not.
    key = old.split(":")[0]
    path = write(tmp_path, GOOD.replace(old, f"{key}: {alias_bomb(6)}", 1))
    line = 1 + GOOD[: GOOD.index(old)].count("\n")
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == (
        f"{path}:{line}: alias 'a2': aliases stand for more than {bl.MAX_ALIAS_NODES} nodes "
        "(a baseline needs a few aliases or none)"
    )


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("description: a test SKU", "description: &loop [1, *loop]"))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == f"{path}:3: alias 'loop' is inside its own anchor"


def test_deep_nesting_is_refused_before_it_exhausts_the_stack(tmp_path: Path) -> None:
    """5000 `[` took Python past its recursion limit: an INTERNALERROR on a run, a traceback on --gb-list-skus."""
    path = write(tmp_path, GOOD.replace("description: a test SKU", "description: " + "[" * 5000, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == f"{path}:3: nested more than {bl.MAX_DEPTH} levels deep (a baseline needs 7)"


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    text = GOOD.replace("provenance: golden node", "provenance: &src golden node").replace(
        "provenance: nccl-tests", "provenance: *src"
    )
    assert bl.load_baseline(write(tmp_path, text)).metrics["all_reduce_busbw_gbps"].default.provenance == "golden node"


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (("description: a test SKU", "description: [a, test]"), ":3: description: must be a string, got list"),
        (("description: a test SKU", "description: 2024-01-01"), ":3: description: must be a string, got date"),
        (("schema_version: 1", "schema_version: true"), ":1: schema_version: must be 1"),
        (("    unit: s\n", "    unit: [s]\n"), ":16: metrics.step_time_s.unit: unknown unit ['s'] (known: "),
        (
            (
                "    values:\n      1GiB: {expected: 400}\n      16GiB: {fail: 430, provenance: a public gate}\n",
                "    values: [[1]]\n",
            ),
            ":30: metrics.all_reduce_busbw_gbps.values: must be a mapping, got list",
        ),
        ((GOOD[GOOD.index("metrics:") :], "metrics: [[1]]\n"), ":5: metrics: must be a mapping, got list"),
        (
            ("      1GiB: {expected: 400}\n", "      1GB: {expected: 400}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GB: is not a message size (8B, 1KiB, 128MiB, 8GiB)",
        ),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: 400, params: {iterations: 0}}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GiB.params.iterations: must be an integer from 1 to 10000, "
            "got 0",
        ),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: 400, params: {warmup: -1}}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GiB.params.warmup: must be an integer from 0 to 10000",
        ),
        (
            ("      1GiB: {expected: 400}\n", "      1GiB: {expected: 400, params: {size_bytes: 1.5}}\n"),
            ":31: metrics.all_reduce_busbw_gbps.values.1GiB.params.size_bytes: must be an integer from 1 to",
        ),
        # A gated size below one float32 element was never measured, and the check passed on nothing; one above
        # any memory failed the node for the baseline's size.
        *(
            (
                ("      1GiB: {expected: 400}\n", f"      {label}: {{expected: 400}}\n"),
                f":31: metrics.all_reduce_busbw_gbps.values.{label}: a gated message size is from 8B to 1024GiB",
            )
            for label in ("0B", "2B", "4B", "2048GiB", "99999999999999GiB")
        ),
        (
            ("    provenance: nccl-tests\n", "    provenance: nccl-tests\n    params: {min_bytes: 64, max_bytes: 8}\n"),
            ":30: metrics.all_reduce_busbw_gbps.params.min_bytes: 64 is above max_bytes 8",
        ),
        # A GEMM's dimensions: a string or a negative one raised in the check, failing the node.
        *(
            (
                ("    provenance: golden node\n", f"    provenance: golden node\n    params: {{{axis}: {bad}}}\n"),
                f":15: metrics.h2d_bandwidth_gbps.params.{axis}: must be an integer from 1 to 65536, got {shown}",
            )
            for axis, bad, shown in (("m", "x", "'x'"), ("n", -1, "-1"), ("k", 0, "0"), ("m", 2**17, "131072"))
        ),
        # An environment holds NAME=VALUE: a name with '=' would set another variable than it names.
        (
            ("    provenance: nccl-tests\n", "    provenance: nccl-tests\n    params: {nccl_env: {NCCL_A=B: 1}}\n"),
            ":30: metrics.all_reduce_busbw_gbps.params.nccl_env.NCCL_A=B: must be an NCCL_* variable",
        ),
    ],
)
def test_every_field_is_type_checked(tmp_path: Path, change: tuple[str, str], expected_error: str) -> None:
    assert change[0] in GOOD
    path = write(tmp_path, GOOD.replace(*change, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value).startswith(f"{path}{expected_error}"), excinfo.value


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (("model: llama3_tiny", "model: [llama3_tiny]"), "pretrain.model: unknown model ['llama3_tiny'] (known: "),
        (("precision: bf16", "precision: [bf16]"), "pretrain.precision: ['bf16'] is not one of fp32, bf16, fp8"),
        (("engine: native", "engine: {native: 1}"), "pretrain.engine: {'native': 1} is not one of native, nemo"),
        # The check's time limit grows with the steps: a huge count ran (and waited) for ever.
        (("timed_steps: 10", "timed_steps: 10000000000"), "pretrain.timed_steps: must be an integer from 1 to 1000"),
        (("warmup_steps: 2", "warmup_steps: 1001"), "pretrain.warmup_steps: must be an integer from 0 to 1000"),
    ],
)
def test_every_pretrain_field_is_type_checked(tmp_path: Path, change: tuple[str, str], expected_error: str) -> None:
    text = (bundled_baselines() / "cpu.yaml").read_text()
    assert change[0] in text
    path = tmp_path / "cpu.yaml"
    path.write_text(text.replace(*change, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert expected_error in str(excinfo.value), excinfo.value


def test_a_peak_source_is_a_string_even_without_a_peak(tmp_path: Path) -> None:
    text = (bundled_baselines() / "cpu.yaml").read_text()
    start, end = text.index("  peak_tflops_per_gpu:"), text.index("  provenance: a layout small")
    path = tmp_path / "cpu.yaml"
    path.write_text(text[:start] + "  peak_tflops_source: [1]\n" + text[end:])
    with pytest.raises(bl.BaselineError, match=r"cpu\.yaml:\d+: pretrain\.peak_tflops_source: must name where"):
        bl.load_baseline(path)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("    unit: s\n", "    unit: {}\n", "metrics.step_time_s.unit: unknown unit "),
        ("status: guessed", "status: {}", "metrics.h2d_bandwidth_gbps.status: "),
        ("sku: TEST", "sku: {}", "sku: "),
        ("    expected: 2.0\n", "    expected: {}\n", "metrics.step_time_s.expected: must be a finite number, got "),
    ],
)
def test_a_value_echoed_in_an_error_is_cut_to_80_characters(tmp_path: Path, old: str, new: str, field: str) -> None:
    long = "[" + ", ".join(f"'{'x' * 40}'" for _ in range(1000)) + "]"
    text = GOOD.replace("status: measured", "status: guessed") if "guessed" in old else GOOD
    path = write(tmp_path, text.replace(old, new.format(long) if "{}" in new else new, 1).replace("{}", long))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    message = str(excinfo.value)
    shown = message.split(field, 1)[1]
    assert shown.startswith("['xxxx") and "..." in shown, message
    assert len(message) < len(str(path)) + len(field) + 200, message


def test_recorded_baseline_round_trips_with_limits_from_the_needed_resolution(tmp_path: Path) -> None:
    old = bl.load_baseline(write(tmp_path, GOOD))
    measurements = (
        [
            {
                "metric": "h2d_bandwidth_gbps",
                "scope": f"gpu{i}",
                "scope_kind": "gpu",
                "unit": "GB/s",
                "direction": "higher",
                "value": v,
            }
            for i, v in enumerate([52.0, 54.0, 53.0])
        ]
        + [
            {
                "metric": "all_reduce_busbw_gbps",
                "scope": s,
                "scope_kind": "message_size",
                "unit": "GB/s",
                "direction": "higher",
                "value": v,
            }
            for s, v in (("1GiB", 410.0), ("16GiB", 470.0))
        ]
        + [
            {
                "metric": "new_metric_s",
                "scope": "node",
                "scope_kind": "node",
                "unit": "s",
                "direction": "lower",
                "value": 3.0,
            },
            {
                "metric": "broken",
                "scope": "node",
                "scope_kind": "node",
                "unit": "s",
                "direction": "lower",
                "value": "nan",
            },
        ]
    )
    doc = bl.recorded_baseline("GOLDEN", old, measurements, "measured on node7")
    path = tmp_path / "GOLDEN.yaml"
    path.write_text(bl.dump_baseline(doc))
    new = bl.load_baseline(path)
    h2d = new.metrics["h2d_bandwidth_gbps"].default
    assert (h2d.expected, h2d.status, h2d.provenance) == (53.0, "measured", "measured on node7")
    # Not the old limits (10% and 48): fail 3/4 and warn 1/2 of the 6% needed below the expected value.
    assert (str(h2d.fail), str(h2d.warn)) == ("4.4%", "3%") and h2d.needed == bl.DEFAULT_NEEDED
    sizes = new.metrics["all_reduce_busbw_gbps"]
    assert {k: r.expected for k, r in sizes.values.items()} == {"1GiB": 410.0, "16GiB": 470.0}
    fresh = new.metrics["new_metric_s"].default
    assert fresh.expected == 3.0 and fresh.fail_limit == pytest.approx(3.138)  # lower is better: 4.6% above
    assert "broken" not in new.metrics
    assert new.detect == old.detect


@pytest.mark.parametrize("value", [30.0, 48.0])  # below the old warn limit, or on it
def test_recording_never_keeps_the_old_limits(tmp_path: Path, value: float) -> None:
    old = bl.load_baseline(write(tmp_path, GOOD))  # h2d warns below 48 GB/s
    m = {
        "metric": "h2d_bandwidth_gbps",
        "scope": "gpu0",
        "scope_kind": "gpu",
        "unit": "GB/s",
        "direction": "higher",
        "value": value,
    }
    doc = bl.recorded_baseline("SLOW", old, [m], "measured")
    (tmp_path / "SLOW.yaml").write_text(bl.dump_baseline(doc))
    ref = bl.load_baseline(tmp_path / "SLOW.yaml").metrics["h2d_bandwidth_gbps"].default
    assert (str(ref.fail), str(ref.warn)) == ("4.4%", "3%")


def _copy(value: float, spread_pct: float, scope: str = "node", **noise: object) -> dict[str, object]:
    return {
        "metric": "host_copy_bandwidth_gbps",
        "scope": scope,
        "scope_kind": "node",
        "unit": "GB/s",
        "direction": "higher",
        "value": value,
        "noise": {"summary": "median", "count": 20, "spread_pct": spread_pct, **noise},
    }


def test_a_recording_rounds_and_counts_the_noise_it_saw_once(tmp_path: Path) -> None:
    # A 2% spread of 20 samples: their median's error, 2% x 1.2533 / sqrt(20) = 0.561% (rounded up), written as
    # spread_pct, which later verdicts count in the figure's resolution; the bands stay those of the 6% needed
    # (four digits: three would round by up to 0.5%, more than a twentieth of 6%).
    doc = bl.recorded_baseline("cpu", None, [_copy(10.8734, 2.0)], "measured on vm1")
    entry = doc["metrics"]["host_copy_bandwidth_gbps"]
    assert (entry["expected"], entry["warn"], entry["fail"], entry["spread_pct"]) == (10.87, "3%", "4.4%", 0.561)
    assert (
        entry["provenance"]
        == "measured on vm1; spread seen: up to 2.0% (median of 20, spread 2.0%) over 1 measurement(s)"
    )
    (tmp_path / "cpu.yaml").write_text(bl.dump_baseline(doc))
    ref = bl.load_baseline(tmp_path / "cpu.yaml").metrics["host_copy_bandwidth_gbps"].default
    assert ref.spread_pct == 0.561  # read back: verdicts count it in the resolution beside the measurement's own
    # a figure of the same node within its noise passes, without a warning
    assert bl.compare(ref, 10.8734 * 0.98, "node").verdict == bl.PASS
    # a quiet figure gets the same bands: the noise does not widen them
    quiet = bl.recorded_baseline("cpu", None, [_copy(10.0, 0.5)], "m")["metrics"]["host_copy_bandwidth_gbps"]
    assert (quiet["warn"], quiet["fail"]) == ("3%", "4.4%")


def test_a_recorded_spread_must_be_a_percentage(tmp_path: Path) -> None:
    doc = bl.recorded_baseline("cpu", None, [_copy(10.0, 1.0)], "m")
    doc["metrics"]["host_copy_bandwidth_gbps"]["spread_pct"] = "wide"
    (tmp_path / "cpu.yaml").write_text(bl.dump_baseline(doc))
    with pytest.raises(bl.BaselineError, match=r"metrics.host_copy_bandwidth_gbps.spread_pct: must be a number"):
        bl.load_baseline(tmp_path / "cpu.yaml")


def test_a_recording_keeps_a_floor_only_metric_floor_only_and_not_the_old_wide_bands(tmp_path: Path) -> None:
    old = bl.load_baseline(REPO / "baselines" / "cpu.yaml")
    triad = {**_copy(44.61, 8.0, scope="numa0"), "metric": "host_memory_triad_gbps", "scope_kind": "numa"}
    doc = bl.recorded_baseline("cpu", old, [triad, _copy(10.87, 3.0)], "measured on vm1")
    entry = doc["metrics"]["host_memory_triad_gbps"]
    assert entry["expected"] == 44.6 and entry["fail"] == 2 and "warn" not in entry  # no 5% band added
    copy = doc["metrics"]["host_copy_bandwidth_gbps"]
    # Not the old 95% floor: 3/4 and 1/2 of the cpu SKU's 60% (a log ratio) below the expected value.
    assert (copy["fail"], copy["warn"]) == ("36%", "26%") and "resolution_pct" not in copy
    assert doc["resolution"]["pct"] == 60
    (tmp_path / "cpu.yaml").write_text(bl.dump_baseline(doc))
    assert bl.load_baseline(tmp_path / "cpu.yaml").metrics["host_memory_triad_gbps"].default.warn is None


# --- the health and topology sections ------------------------------------------------------------------------


def test_health_and_topology_sections_load(tmp_path: Path) -> None:
    b = bl.load_baseline(write(tmp_path, SECTIONS))
    assert b.health == bl.HealthBaseline(
        provenance="a public health check",
        min_driver_version="570.133.20",
        nvlinks_per_gpu=18,
        xid_actions={13: "drain", 63: "ignore", 92: "ignore"},
        ecc_limits={"sram_uncorrectable": 0, "row_remaps_pending": 0},
    )
    assert b.topology == bl.TopologyBaseline("the SKU's documentation", (1, 0), None, True, 400.0)
    assert bl.load_baseline(write(tmp_path, GOOD)).health is None


def test_bundled_gpu_baselines_carry_only_public_gates_and_layouts() -> None:
    loaded = {b.sku: b for b in bl.load_all(bundled_baselines())}
    for sku in ("ND_GB200_v6", "ND_H100_v5", "ND_H200_v5", "ND96asr_v4"):
        health = loaded[sku].health
        assert health is not None and "azurehpc-health-checks" in health.provenance, sku
        assert not health.xid_actions  # NVIDIA's catalog decides, as it is
        assert health.ecc_limits["sram_uncorrectable"] == 0 and health.min_driver_version is None  # none published
    gb200, ndv4 = loaded["ND_GB200_v6"], loaded["ND96asr_v4"]
    assert gb200.health is not None and gb200.health.nvlinks_per_gpu == 18
    assert gb200.topology is not None and gb200.topology.gpus_per_numa_node == 2
    assert ndv4.topology is not None and ndv4.topology.gpu_numa_nodes == (1, 1, 0, 0, 3, 3, 2, 2)
    assert loaded["cpu"].health is None and loaded["cpu"].topology is None


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (("'570.133.20'", "570.13"), ":6: health.min_driver_version: 570.13: quote it, e.g. '570.133.20'"),
        (("nvlinks_per_gpu: 18", "nvlinks_per_gpu: 0"), ":7: health.nvlinks_per_gpu: 0: must be a whole number"),
        (("[63, 92]", "[63, 0]"), ":8: health.xid_actions.ignore: 0: not an Xid code (a whole number, 1 to 65535)"),
        (("[63, 92]", "[63, '63']"), ":8: health.xid_actions.ignore: '63': not an Xid code"),
        (("[63, 92]", "[63, 13]"), ":8: health.xid_actions.ignore: Xid 13 has an action already: drain"),
        (("{drain: [13]", "{drop: [13]"), ":8: health.xid_actions.drop: unknown field (allowed:"),
        (("{drain: [13]", "{drain: 13"), ":8: health.xid_actions.drain: 13: must be a list of Xid codes"),
        (("xid_actions: {drain: [13], ignore: [63, 92]}", "critical_xids: [48, 79]"), ":8: health.critical_xids: no"),
        (("sram_uncorrectable: 0", "sram_uncorrectable: -1"), ":9: health.ecc_limits.sram_uncorrectable: -1: must be"),
        (("sram_uncorrectable: 0", "sram_uncorrectible: 0"), ":9: health.ecc_limits.sram_uncorrectible: unknown"),
        (("  provenance: a public health check\n", ""), "health.provenance: must be a non-empty string"),
        (("[1, 0]", "[1, 0, 1]"), ":12: topology.gpu_numa_nodes: names 3 GPUs but detect.gpu_count is 2"),
        (("nic_on_gpu_numa_node: true", "nic_on_gpu_numa_node: yes please"), ":13: topology.nic_on_gpu_numa_node:"),
        (("ib_rate_gbps: 400", "ib_rate_gbps: fast"), ":14: topology.ib_rate_gbps: 'fast': must be a rate in Gb/s"),
        (("topology:\n", "topology:\n  numa: 1\n"), ":12: topology.numa: unknown field"),
    ],
)
def test_section_errors_name_file_line_and_field(tmp_path: Path, change: tuple[str, str], expected_error: str) -> None:
    old, new = change
    assert old in SECTIONS
    path = write(tmp_path, SECTIONS.replace(old, new, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value).startswith(str(path)) and expected_error in str(excinfo.value), str(excinfo.value)


def test_recording_keeps_the_health_gates_and_the_layout(tmp_path: Path) -> None:
    old = bl.load_baseline(write(tmp_path, SECTIONS))
    (tmp_path / "NEW.yaml").write_text(bl.dump_baseline(bl.recorded_baseline("NEW", old, [], "measured")))
    new = bl.load_baseline(tmp_path / "NEW.yaml")
    assert (new.health, new.topology) == (old.health, old.topology)


def test_the_gpu_sku_runs_the_azure_layout_and_has_no_step_time_to_compare_yet() -> None:
    from pytest_gbvalidate.baselines import load_baseline

    b = load_baseline(Path(REPO / "baselines" / "ND_GB200_v6.yaml"))
    assert b.pretrain is not None
    ref = b.metrics["llama3_8b_step_time_s"].reference("native-bf16-mbs4-gbs128-tp1-pp2-cp1-dp2-ac-seq8192")
    assert ref is not None
    assert (ref.status, ref.has_reference) == ("provisional", False)


# --- unit, direction and scope: the catalog's for the metrics it has -----------------------------------------

BARE = """\
schema_version: 1
sku: TEST
metrics:
  h2d_bandwidth_gbps:
    status: measured
    expected: 50
    fail: 10%
    warn: 48
    provenance: golden node
  all_reduce_busbw_gbps:
    status: provisional
    fail: 10%
    provenance: nccl-tests
    values:
      1GiB: {expected: 400}
  llama3_tiny_step_time_s:
    status: provisional
    fail: 2.0
    provenance: a guess
  fsck_s:
    unit: s
    direction: lower
    scope: node
    status: provisional
    fail: 60
    provenance: a site's own check
"""
RESTATED = {
    "  h2d_bandwidth_gbps:\n": "    unit: GB/s\n    direction: higher\n    scope: gpu\n",
    "  all_reduce_busbw_gbps:\n": "    unit: GB/s\n    direction: higher\n    scope: message_size\n",
    "  llama3_tiny_step_time_s:\n": "    unit: s\n    direction: lower\n    scope: layout\n",
}


def restated(text: str) -> str:
    """`text` with each metric of RESTATED it has giving its unit, direction and scope."""
    headers = [header for header in RESTATED if header in text]
    assert headers
    for header in headers:
        text = text.replace(header, header + RESTATED[header], 1)
    return text


def test_a_catalog_metric_takes_unit_direction_and_scope_from_the_catalog(tmp_path: Path) -> None:
    b = bl.load_baseline(write(tmp_path, BARE))
    kinds = {
        name: {(r.unit, r.direction, r.scope_kind) for r in (m.default, *m.values.values())}
        for name, m in b.metrics.items()
    }
    assert kinds == {
        "h2d_bandwidth_gbps": {("GB/s", "higher", "gpu")},
        "all_reduce_busbw_gbps": {("GB/s", "higher", "message_size")},
        "llama3_tiny_step_time_s": {("s", "lower", "layout")},
        "fsck_s": {("s", "lower", "node")},
    }
    for name in RESTATED:
        spec = CATALOG[name.strip().rstrip(":")]
        assert kinds[spec.name] == {(spec.unit, spec.direction, spec.scope_kind)}
    # The same model as an entry that restates them.
    assert bl.load_baseline(write(tmp_path, restated(BARE))).metrics == b.metrics
    ref = b.metrics["h2d_bandwidth_gbps"].reference("gpu0")
    assert ref is not None and ref.fail_limit == pytest.approx(45.0)  # 10% below: higher is better
    assert bl.compare(ref, 44.0, "gpu0").verdict == "fail"


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (
            ("  h2d_bandwidth_gbps:\n", "  h2d_bandwidth_gbps:\n    unit: TB/s\n"),
            ":5: metrics.h2d_bandwidth_gbps.unit: 'TB/s' disagrees with the measured metric ('GB/s')",
        ),
        (
            ("  h2d_bandwidth_gbps:\n", "  h2d_bandwidth_gbps:\n    direction: lower\n"),
            ":5: metrics.h2d_bandwidth_gbps.direction: 'lower' disagrees with the measured metric ('higher')",
        ),
        (
            ("  all_reduce_busbw_gbps:\n", "  all_reduce_busbw_gbps:\n    scope: node\n"),
            ":11: metrics.all_reduce_busbw_gbps.scope: 'node' disagrees with the measured metric ('message_size')",
        ),
        (  # checked before it is compared with the catalog
            ("  h2d_bandwidth_gbps:\n", "  h2d_bandwidth_gbps:\n    unit: GiB/s\n"),
            ":5: metrics.h2d_bandwidth_gbps.unit: unknown unit 'GiB/s' (known: ",
        ),
        (  # the catalog's scope, message sizes, holds the labels to sizes
            ("      1GiB: {expected: 400}\n", "      1GB: {expected: 400}\n"),
            ":15: metrics.all_reduce_busbw_gbps.values.1GB: is not a message size (8B, 1KiB, 128MiB, 8GiB)",
        ),
        (  # the catalog's direction, lower is better, orders the limits
            ("    fail: 2.0\n", "    fail: 2.0\n    warn: 2.5\n"),
            ":18: metrics.llama3_tiny_step_time_s.fail: 2 is below warn 2.5 (lower is better)",
        ),
    ],
)
def test_a_catalog_metric_that_restates_its_kind_must_agree(
    tmp_path: Path, change: tuple[str, str], expected_error: str
) -> None:
    assert change[0] in BARE
    path = write(tmp_path, BARE.replace(*change, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}{expected_error}"), message
    assert "\n" not in message


@pytest.mark.parametrize("field", ["unit", "direction", "scope"])
def test_a_site_metric_without_its_unit_direction_or_scope_is_a_one_line_error(tmp_path: Path, field: str) -> None:
    text = BARE.split("  fsck_s:\n")[1]
    line = next(row for row in text.splitlines() if row.startswith(f"    {field}: "))
    path = write(tmp_path, BARE.replace(f"{line}\n", "", 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value) == (
        f"{path}:21: metrics.fsck_s.{field}: missing (not a bundled metric: give its unit, direction and scope)"
    )


def test_a_recorded_catalog_metric_has_no_unit_direction_or_scope_and_loads_back_equal(tmp_path: Path) -> None:
    def record(metric: str, scope: str, kind: str, unit: str, direction: str, value: float) -> dict[str, object]:
        return {
            "metric": metric,
            "scope": scope,
            "scope_kind": kind,
            "unit": unit,
            "direction": direction,
            "value": value,
        }

    measurements = [
        *(record("h2d_bandwidth_gbps", f"gpu{i}", "gpu", "GB/s", "higher", v) for i, v in enumerate([52.0, 54.0])),
        *(record("all_reduce_busbw_gbps", s, "message_size", "GB/s", "higher", v) for s, v in [("1GiB", 410.0)]),
        record("fsck_s", "node", "node", "s", "lower", 30.0),
    ]
    doc = bl.recorded_baseline("GOLDEN", None, measurements, "measured on node7")
    for name in ("h2d_bandwidth_gbps", "all_reduce_busbw_gbps"):
        assert not {"unit", "direction", "scope"} & set(doc["metrics"][name]), doc["metrics"][name]
    assert {k: doc["metrics"]["fsck_s"][k] for k in ("unit", "direction", "scope")} == {
        "unit": "s",
        "direction": "lower",
        "scope": "node",
    }  # a site's own metric keeps them: nothing else says them
    text = bl.dump_baseline(doc)
    assert "unit: GB/s" not in text and "scope: gpu" not in text
    path = tmp_path / "GOLDEN.yaml"
    path.write_text(text)
    loaded = bl.load_baseline(path)
    h2d = loaded.metrics["h2d_bandwidth_gbps"].default
    assert (h2d.unit, h2d.direction, h2d.scope_kind, h2d.expected) == ("GB/s", "higher", "gpu", 53.0)
    sizes = loaded.metrics["all_reduce_busbw_gbps"].values["1GiB"]
    assert (sizes.unit, sizes.direction, sizes.scope_kind, sizes.expected) == ("GB/s", "higher", "message_size", 410.0)
    # Equal to the same recording with the triples written out, and recording again changes nothing.
    (tmp_path / "full").mkdir()
    full = tmp_path / "full" / "GOLDEN.yaml"
    full.write_text(restated(text))
    assert full.read_text().count("unit: GB/s") == 2
    assert bl.load_baseline(full).metrics == loaded.metrics
    assert bl.recorded_baseline("GOLDEN", loaded, measurements, "measured on node7") == doc


def test_a_recording_measured_against_a_spec_the_catalog_disagrees_with_is_refused(tmp_path: Path) -> None:
    # A check that passed its own spec for a catalog metric: the unit it measured in is written, and the loader
    # refuses it (a recording never silently takes the catalog's unit for figures measured in another).
    m = {"metric": "h2d_bandwidth_gbps", "scope": "gpu0", "scope_kind": "gpu", "unit": "TB/s", "direction": "higher"}
    doc = bl.recorded_baseline("ODD", None, [{**m, "value": 0.05}], "measured")
    assert doc["metrics"]["h2d_bandwidth_gbps"]["unit"] == "TB/s"
    (tmp_path / "ODD.yaml").write_text(bl.dump_baseline(doc))
    with pytest.raises(bl.BaselineError, match=r"h2d_bandwidth_gbps\.unit: 'TB/s' disagrees with the measured metric"):
        bl.load_baseline(tmp_path / "ODD.yaml")


def test_the_least_gated_message_size_is_the_sweeps_least() -> None:
    """The schema may not import the sweeps (it knows nothing of pytest): the two say the same size."""
    from pytest_gbvalidate.baselines.schema_metrics import LEAST_LABEL_BYTES
    from pytest_gbvalidate.sweeps import SWEEP_BYTES

    assert min(least for least, _ in SWEEP_BYTES.values()) == LEAST_LABEL_BYTES
