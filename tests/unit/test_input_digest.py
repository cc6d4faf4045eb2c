"""Resume identities come from content: a copied or re-cloned project (new mtimes, new absolute paths) gives
the same input digests, and a changed byte gives another."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protege import tracking

STAGE = "mkdir -p out && printf 'rows 1' > out/table.parquet && printf 'w' > out/weights.bin && printf x > single.txt"
DVC_YAML = f"""stages:
  make:
    cmd: {STAGE}
    outs:
      - out
      - single.txt
"""


def copy_with_new_mtimes(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copy)  # shutil.copy keeps no mtimes, as `cp -r` does
    later = 10 ** 9 * 4_000_000_000  # ns: a time no file of src has
    for f in dst.rglob("*"):
        if f.is_file():
            os.utime(f, ns=(later, later))
    return dst


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    proj = tmp_path_factory.mktemp("digest") / "proj"
    proj.mkdir()
    (proj / "dvc.yaml").write_text(DVC_YAML)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=proj, check=True, env=env)
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=proj, check=True, env=env, capture_output=True)
    return proj


def test_a_file_inside_a_dvc_folder_output_is_named_by_its_manifest_md5(project):
    # DVC 3 records a file's md5 of its bytes in the folder's .dir manifest
    assert tracking.input_digest(project, "out/table.parquet") == hashlib.md5(b"rows 1").hexdigest()
    assert tracking.input_digest(project, "single.txt") == hashlib.md5(b"x").hexdigest()  # the lock's own entry
    assert tracking.input_digest(project, "out").endswith(".dir")
    assert tracking.input_digest(project, "nowhere.parquet") == "absent"


def test_a_copy_with_new_mtimes_keeps_every_digest(project, tmp_path):
    copy = copy_with_new_mtimes(project, tmp_path / "copy")
    assert (copy / "out/table.parquet").stat().st_mtime_ns != (project / "out/table.parquet").stat().st_mtime_ns
    for rel in ("out/table.parquet", "out/weights.bin", "out", "single.txt"):
        assert tracking.input_digest(copy, rel) == tracking.input_digest(project, rel), rel


def test_without_the_manifest_the_bytes_decide(project, tmp_path):
    """Before a `dvc pull` the cache has no manifest: the file's own md5 stands in, and it is the same md5."""
    copy = copy_with_new_mtimes(project, tmp_path / "nocache")
    shutil.rmtree(copy / ".dvc" / "cache")
    assert tracking.input_digest(copy, "out/table.parquet") == tracking.input_digest(project, "out/table.parquet")
    (copy / "out/table.parquet").write_bytes(b"rows 2")  # same size, other content
    assert tracking.input_digest(copy, "out/table.parquet") == hashlib.md5(b"rows 2").hexdigest()


def test_outside_dvc_a_folder_is_named_by_its_files_contents(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "w.bin").write_bytes(b"12")
    os.utime(b / "sub" / "w.bin", ns=(1, 1))
    assert tracking.input_digest(tmp_path, "a") == tracking.input_digest(tmp_path, "b")
    (b / "sub" / "w.bin").write_bytes(b"13")
    assert tracking.input_digest(tmp_path, "a") != tracking.input_digest(tmp_path, "b")
    (b / "sub" / "w.bin").rename(b / "sub" / "v.bin")  # a renamed file is another folder
    (b / "sub" / "v.bin").write_bytes(b"12")
    assert tracking.input_digest(tmp_path, "a") != tracking.input_digest(tmp_path, "b")


def test_a_cache_dir_set_in_the_dvc_config_is_read(project, tmp_path):
    copy = copy_with_new_mtimes(project, tmp_path / "moved")
    shutil.move(copy / ".dvc" / "cache", tmp_path / "shared-cache")
    (copy / ".dvc" / "config").write_text("[core]\n    no_scm = True\n[cache]\n    dir = ../../shared-cache\n")
    (copy / "out/table.parquet").write_bytes(b"edited")  # only the manifest can still give the old md5
    assert tracking.input_digest(copy, "out/table.parquet") == hashlib.md5(b"rows 1").hexdigest()
