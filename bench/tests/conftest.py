"""Tests of the benchmark scripts themselves: they import bench/, which the library's tests (tests/) never do.
The fixtures are the library tests' own."""
from tests.conftest import micro, one_thread, tiny_data  # noqa: F401
