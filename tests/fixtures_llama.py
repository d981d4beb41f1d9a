"""The real llama.cpp server (xllamacpp, SmolLM2-135M from the lab group), once per test worker.

Registered in tests/conftest.py (`pytest_plugins`). `llama_cpp` is session-scoped: with pytest-xdist
each worker process starts its own (~1-7 s), so the tests that use it belong in one group (the
`xdist_group` mark, see tests/worker_groups.py) to start it once. It starts a process: tests that
use it are marked `e2e` (tests/e2e_guard.py). Its log is kept under the session's temporary
directory, for a failure to point at.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from labs.worker.llama_cpp import LlamaCppServer, run_llama_cpp

#: Slots: the lab cells and graders in one worker's tests run at most this many requests at once.
LLAMA_CPP_SLOTS = 4


@pytest.fixture(scope="session")
def llama_cpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    """llama.cpp's server on 127.0.0.1 and a free port: its `base_url` (`http://127.0.0.1:PORT/v1`)
    and facts (model id and file, xllamacpp's and llama.cpp's versions)."""
    log_path = tmp_path_factory.mktemp("llama_cpp") / "llama.cpp.log"
    with run_llama_cpp(n_parallel=LLAMA_CPP_SLOTS, log_path=log_path) as server:
        yield server
