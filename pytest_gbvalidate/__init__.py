"""pytest-gbvalidate: GPU-node hardware validation as pytest suites with per-SKU baselines.

PYTEST_DONT_REWRITE: the plugin's own asserts are internal invariants, not test assertions. Without this
marker pytest warns "Module already imported so cannot be rewritten" whenever an editable install puts the
package where its rewrite hook cannot see it. (The suites are test modules and are rewritten as usual.)
"""

__version__ = "0.1.0"
