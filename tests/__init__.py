"""The plugin's own tests, laid out by one rule:

- `unit/test_<module>.py`: tests that call one package module directly, with no pytest run inside (driving ranks
  through the gang API counts), named for the module they test (`unit/test_settings.py` for
  `pytest_gbvalidate/settings.py`, `unit/test_llama_model.py` for `workloads/llama/model.py`).
- `e2e/test_<suite-or-feature>.py`: tests that run pytest end to end (pytester, or a subprocess: pytest, torchrun, a
  script in benchmarks/) and read back what it wrote (JUnit XML, the JSON report, the exit code).
- `helpers/`: the shared fakes and helpers (fake NVML and nodes, functions for gang ranks, rank-fault injectors,
  plugins loaded with `-p`, sample tool outputs, the readers and lab baselines of the e2e runs). Fixtures that
  several e2e modules use live in `e2e/conftest.py`; `conftest.py` here applies to every test.

A test module imports from `tests.helpers` only, never from another test module.
"""
