"""scripts/clang-check.sh (clang's thread-safety analysis, run by scripts/test.sh) fails,
with clang's warning, on a member read without the mutex that guards it, and passes the
same class when the read takes the lock; flags from compile_commands.json that only GCC
knows are dropped."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "clang-check.sh"

COUNTER = """\
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  int Get() { %s return n_; }
  void Add() {
    absl::MutexLock lock(&mu_);
    ++n_;
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

int main() {
  Counter c;
  c.Add();
  return c.Get();
}
"""

# Fails to compile unless the file's flags come from its compile_commands.json entry.
FROM_ENTRY = """\
#ifndef FROM_COMPILE_COMMANDS
#error not the flags of compile_commands.json
#endif
"""


def run(build, *files):
    # An empty build directory: the file's flags are the script's defaults (abseil from
    # /usr/include), whatever state the real build is in.
    env = dict(os.environ, HYBRIDPS_BUILD_DIR=str(build), HYBRIDPS_CLANG_TIMEOUT="60")
    return subprocess.run(["bash", str(CHECK), *map(str, files)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_a_guarded_member_read_without_its_lock_fails(tmp_path):
    bad = tmp_path / "bad.cc"
    bad.write_text(COUNTER % "")
    r = run(tmp_path / "build", bad)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "reading variable 'n_' requires holding mutex 'mu_'" in out, out
    assert "[-Werror,-Wthread-safety-analysis]" in out, out
    assert "1 of 1 files failed" in out, out


def test_the_same_read_under_the_lock_passes(tmp_path):
    good = tmp_path / "good.cc"
    good.write_text(COUNTER % "absl::MutexLock lock(&mu_);")
    r = run(tmp_path / "build", good)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("clang-check: 1 files checked, clean"), r.stdout


def test_flags_only_gcc_knows_are_dropped(tmp_path):
    good = tmp_path / "good.cc"
    good.write_text(FROM_ENTRY + COUNTER % "absl::MutexLock lock(&mu_);")
    build = tmp_path / "build"
    build.mkdir()
    command = ("/usr/bin/c++ -DFROM_COMPILE_COMMANDS=1 -O2 -g -Wall -Wextra -Werror -Wno-maybe-uninitialized "
               "-Wduplicated-cond -fconcepts -fno-var-tracking-assignments -flto=auto "
               f"-fmax-errors=5 -std=gnu++20 -o good.o -c {good}")
    (build / "compile_commands.json").write_text(json.dumps(
        [{"directory": str(build), "command": command, "file": str(good)}]))
    r = run(build, good)
    assert r.returncode == 0, r.stdout + r.stderr
    # A bad file with the same flags still fails.
    good.write_text(FROM_ENTRY + COUNTER % "")
    r = run(build, good)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "requires holding mutex 'mu_'" in r.stdout, r.stdout
