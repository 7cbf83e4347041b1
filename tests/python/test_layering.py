"""The layering check (scripts/check_layering.py) passes on the tree and fails, naming the
file and the edge, on a forbidden include or a folder map (docs/architecture.md) that is
not the tree."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check_layering.py"


def run(root):
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(tmp_path):
    """A copy of the sources the check reads."""
    for d in ("common", "optimizers", "scheduler", "server", "worker", "mxnet_kvstore",
              "tests", "bench", "examples", "docs", "scripts"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_the_tree_follows_the_layering():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("file,include,edge", [
    ("worker/allreduce/allreduce_store.cc", "worker/ps/ps_store.h", "worker/allreduce/ may not "
     "depend on worker/ps/"),
    ("worker/ps/ps_store.cc", "worker/allreduce/allreduce_store.h", "worker/ps/ may not depend "
     "on worker/allreduce/"),
    ("worker/ps/local/node_gpu_reduce.cc", "worker/ps/ps_store.h", "worker/ps/local/ may not "
     "depend on worker/ps/"),
    ("worker/kvstore.h", "worker/ps/ps_store.h", "worker/ may not depend on worker/ps/"),
    ("worker/node/negotiation.cc", "worker/comm/gloo_comm.h", "worker/node/ may not depend on "
     "worker/comm/"),
    ("server/key_store.cc", "worker/kvstore.h", "server/ may not depend on worker/"),
    ("worker/ps/ps_store.cc", "mxnet_kvstore/src/engine_bridge.h", "may not depend on "
     "mxnet_kvstore/"),
    ("tests/cluster/local_cluster.cc", "mxnet_kvstore/src/engine_bridge.h",
     "nothing outside mxnet_kvstore/ may include it"),
])
def test_a_forbidden_include_fails_naming_the_file_and_edge(tree, file, include, edge):
    path = tree / file
    path.write_text(f'#include "{include}"\n' + path.read_text())
    r = run(tree)
    assert r.returncode == 1, r.stdout
    assert f"{file}:1: includes {include}" in r.stdout, r.stdout
    assert edge in r.stdout, r.stdout


def test_a_folder_missing_from_the_map_fails(tree):
    (tree / "worker" / "extra").mkdir()
    (tree / "worker" / "extra" / "x.cc").write_text("int x;\n")
    r = run(tree)
    assert r.returncode == 1
    assert "the folder map does not name worker/extra/" in r.stdout, r.stdout
    assert "worker/extra/: a folder with sources that the layering table does not know" in \
        r.stdout, r.stdout


def test_a_map_entry_without_its_folder_fails(tree):
    shutil.rmtree(tree / "worker" / "gpu")
    r = run(tree)
    assert r.returncode == 1
    assert "names worker/gpu/, which does not exist" in r.stdout, r.stdout
