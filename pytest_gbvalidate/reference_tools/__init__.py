"""NVIDIA's reference tools, run beside our own measurements so an operator can compare them side by side:
nccl-tests (`all_reduce_perf`, `all_gather_perf`, ...), nvbandwidth and perftest's `ib_write_bw`; fio for storage.
Their output is parsed into the measurements our suites make -- same metric names, same scope labels, tagged with
the tool. Each tool's JSON is read where the binary offers it, its text otherwise; a JSON document of the wrong
shape (a field missing or of the wrong type, NaN, a number out of range) is a ToolError naming the field. One
module per tool (its command line, its output formats, its figures in our terms) and `runner`, what they share.
"""
