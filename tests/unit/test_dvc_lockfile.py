"""A stage reading dvc.lock while the flow commits another stage sees the whole file, old or new, never half."""
import threading
import time

import yaml

from protege.dvc_lockfile import dvc_writing, read_dvc_lock
from protege.tracking import dvc_digest


def test_a_reader_waits_for_a_commit_half_way_through(tmp_path):
    (tmp_path / ".dvc").mkdir()
    lock = tmp_path / "dvc.lock"
    whole = "schema: '2.0'\nstages:\n  sft:\n    outs:\n    - path: models/sft\n      hash: md5\n      md5: abc.dir\n"
    lock.write_text(whole)
    half_written = threading.Event()
    seen: list[str | None] = []

    def commit():
        with dvc_writing(tmp_path):
            with open(lock, "w") as f:  # DVC rewrites in place
                f.write(whole[:60])
                f.flush()
                half_written.set()
                time.sleep(0.3)
                f.write(whole[60:])

    writer = threading.Thread(target=commit)
    writer.start()
    half_written.wait()
    seen.append(read_dvc_lock(tmp_path))
    writer.join()
    assert seen == [whole]
    assert yaml.safe_load(seen[0])["stages"]["sft"]["outs"][0]["md5"] == "abc.dir"
    assert dvc_digest(tmp_path, "models/sft") == "abc.dir"


def test_no_lock_file_reads_as_none_and_without_dvc_folder_reads_unguarded(tmp_path):
    assert read_dvc_lock(tmp_path) is None
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    assert read_dvc_lock(tmp_path) == "stages: {}\n"
    assert not (tmp_path / ".dvc").exists()  # reading made no guard folder in a non-DVC folder
