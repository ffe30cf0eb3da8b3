"""Example kernels for pytest-attnkit: one registered as a plain function, one as a class."""
