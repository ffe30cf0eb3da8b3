"""The bundled implementations (importable as ``pytest_attnkit.implementations``), one per module."""
