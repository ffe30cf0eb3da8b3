"""The bundled suites, collected by ``pytest --attnkit`` (importable as ``pytest_attnkit.suites``)."""
