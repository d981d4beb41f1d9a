"""Shared pytest setup. Fixtures for one area live in that area's own module under tests/ and are
registered here, so no two areas edit the same file."""

# tests.e2e_guard first: it fails a test that starts a process without the `e2e` mark. tests.worker_groups
# says which tests share a pytest-xdist worker.
pytest_plugins = ["tests.e2e_guard", "tests.worker_groups", "tests.fixtures_e2e", "tests.fixtures_lab", "tests.fixtures_chaos"]
