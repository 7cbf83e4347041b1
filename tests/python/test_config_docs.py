"""docs/configuration.md is generated from common/options.h and common/options.cc by
scripts/gen-config-docs.py: the test fails when the committed page differs from what the
script generates, or when the code reads a HYBRIDPS_* variable the page does not list."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen-config-docs.py"
SCANNED = ("common", "worker", "server", "scheduler", "mxnet_kvstore", "scripts")


def run(root, *args):
    return subprocess.run([sys.executable, str(GEN), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path):
    """A copy of what the generator reads and scans."""
    for d in SCANNED:
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "configuration.md", tmp_path / "docs" / "configuration.md")
    shutil.copy(ROOT / "CMakeLists.txt", tmp_path / "CMakeLists.txt")
    return tmp_path


def test_the_page_is_generated_and_lists_every_variable_the_code_reads():
    r = run(ROOT, "--check")
    assert r.returncode == 0, r.stdout + r.stderr


def add_option(tree):
    h = tree / "common" / "options.h"
    h.write_text(h.read_text().replace(
        "  // InvalidArgument naming the field",
        "  // HYBRIDPS_NEW_KNOB: a knob added without regenerating the page.\n"
        "  int new_knob = 3;\n\n  // InvalidArgument naming the field", 1))
    cc = tree / "common" / "options.cc"
    cc.write_text(cc.read_text().replace(
        '  if (o.backend == "dist_allreduce"',
        '  RETURN_IF_ERROR(GetNumber("HYBRIDPS_NEW_KNOB", &o.new_knob));\n'
        '  if (o.backend == "dist_allreduce"', 1))


def test_an_option_added_without_regenerating_fails_naming_it(tree):
    assert run(tree, "--check").returncode == 0
    add_option(tree)
    r = run(tree, "--check")
    assert r.returncode == 1, r.stdout
    assert "docs/configuration.md is not what scripts/gen-config-docs.py generates" in r.stdout
    assert "HYBRIDPS_NEW_KNOB is read by common/options.cc but docs/configuration.md does " \
        "not list it" in r.stdout, r.stdout
    # Regenerating fixes it, with the field's comment and default on the page.
    assert run(tree).returncode == 0
    assert run(tree, "--check").returncode == 0
    page = (tree / "docs" / "configuration.md").read_text()
    assert "### `HYBRIDPS_NEW_KNOB`" in page
    assert "A knob added without regenerating the page." in page
    assert "| [`HYBRIDPS_NEW_KNOB`](#hybridps_new_knob) | 3 |" in page


def test_a_script_reading_an_unlisted_variable_fails_naming_it(tree):
    sh = tree / "scripts" / "build.sh"
    sh.write_text(sh.read_text() + 'knob=${HYBRIDPS_SCRIPT_KNOB:-1}\n')
    py = tree / "mxnet_kvstore" / "hybridps" / "mxnet" / "__init__.py"
    py.write_text(py.read_text() + '\n_k = os.environ.get("HYBRIDPS_PLUGIN_KNOB")\n')
    r = run(tree, "--check")
    assert r.returncode == 1, r.stdout
    assert "HYBRIDPS_SCRIPT_KNOB is read by scripts/build.sh" in r.stdout, r.stdout
    assert "HYBRIDPS_PLUGIN_KNOB is read by mxnet_kvstore/hybridps/mxnet/__init__.py" in \
        r.stdout, r.stdout
