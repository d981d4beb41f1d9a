"""Shared pytest setup. Fixtures for one area live in that area's own module under tests/ and are
registered here, so no two areas edit the same file."""

from hypothesis import settings

# tests.e2e_guard first: it fails a test that starts a process without the `e2e` mark. tests.worker_groups
# says which tests share a pytest-xdist worker.
pytest_plugins = [
    "tests.e2e_guard",
    "tests.worker_groups",
    "tests.fixtures_e2e",
    "tests.fixtures_lab",
    "tests.fixtures_chaos",
    "tests.fixtures_llama",
]

# No test asserts on time (the bench compares speeds, in one run, as ratios): hypothesis's default
# 200 ms deadline per example is such an assertion, and on a shared 2-core machine under the whole
# suite's load an example that takes 40 ms alone took 350 ms. What can hang still has a deadline
# (trio's `fail_after`, pytest-timeout). And the same examples every run (`derandomize`): a suite
# that drew new ones each time would find a new case on some fresh clone and fail it there, which
# says nothing about the change being tested. A case worth keeping goes into a test of its own (the
# fuzz contracts' finds are in the dialects' rule tests); to explore, run them with
# `--hypothesis-profile=default`.
settings.register_profile("finishline", deadline=None, derandomize=True)
settings.load_profile("finishline")
