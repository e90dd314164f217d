"""The bundled validation suites: health, topology, bandwidth, collectives, pretraining and reference tools,
run with `pytest --gb-sku=SKU suites/` or `pytest --pyargs pytest_gbvalidate.suites`."""
