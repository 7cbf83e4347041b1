"""The docs site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken link,
a page missing from docs/ or a page left out of the nav fails it."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_site(root: Path, out_parent: Path) -> subprocess.CompletedProcess:
    out = Path(tempfile.mkdtemp(prefix="docs-site-", dir=out_parent))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    try:
        return subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
             "-f", str(root / "mkdocs.yml"), "-d", str(out)],
            capture_output=True, text=True, timeout=240, env=env, cwd=root)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def out_parent(tmp_path: Path) -> Path:
    """A temporary folder inside the build tree (CTest sets HYBRIDPS_BUILD_DIR)."""
    build = os.environ.get("HYBRIDPS_BUILD_DIR")
    if build and Path(build).is_dir():
        return Path(build)
    return tmp_path


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    r = build_site(ROOT, out_parent(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=True)
    for link in ("results", "cluster_results"):  # symlinks into bench/
        if (ROOT / "bench" / link).exists():
            shutil.copytree(ROOT / "bench" / link, copy / "bench" / link)
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
    r = build_site(copy, tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "no-such-page.md" in r.stdout + r.stderr
