"""NCCL's net plugin (pytest_gbvalidate/node/nccl_stack.py): chosen and loaded as NCCL chooses and loads it."""

from __future__ import annotations

import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.node import nccl_stack


def test_the_net_plugin_is_loaded_as_nccl_loads_it() -> None:
    assert nccl_stack.load_problem("libc.so.6") is None
    default = "libnccl-net.so"
    assert nccl_stack.net_plugin(default, {}, []) == (default, "the baseline's health.nccl_net_plugin")
    for value, library in (("mlx5", "libnccl-net-mlx5.so"), ("/opt/p/libx.so", "/opt/p/libx.so"), ("NONE", None)):
        chosen = f"NCCL_NET_PLUGIN={value} (from the environment)"
        assert nccl_stack.net_plugin(default, {"NCCL_NET_PLUGIN": value}, []) == (library, chosen)
    problem = nccl_stack.load_problem("libnccl-net-of-no-node.so") or ""
    assert problem.startswith("cannot load libnccl-net-of-no-node.so: ") and "LD_LIBRARY_PATH=" in problem
