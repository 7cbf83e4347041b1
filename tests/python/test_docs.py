"""The docs site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: a broken link,
a page missing from docs/ or a page left out of the nav fails it. The README stays short,
keeps the two commands CI relies on, has no dates or commit hashes, and every relative link
in it resolves."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


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


def test_the_readme_is_short_and_shows_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; keep it about 200"
    head = "\n".join(lines[:12])
    assert "bash scripts/demo.sh" in head and "bash scripts/test.sh" in head, head


def test_the_readme_has_no_dates_or_commit_hashes():
    text = README.read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in bench/results/"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, f"commit hashes in README.md: {hashes}"


def test_every_relative_link_of_the_readme_resolves():
    text = README.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (ROOT / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to missing files: {missing}"
