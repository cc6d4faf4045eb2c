import sys

import pytest

from protege.runtime.host_memory import release_free_host_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_heap_is_handed_back_on_glibc():
    blocks = [bytearray(64 * 1024) for _ in range(200)]  # heap chunks (below the mmap threshold)
    del blocks
    assert release_free_host_memory() is True
