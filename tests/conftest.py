"""Shared pytest setup. Fixtures for one area live in that area's own module under tests/ and are
registered here, so no two areas edit the same file."""

pytest_plugins = ["tests.fixtures_e2e", "tests.fixtures_lab", "tests.fixtures_chaos"]
