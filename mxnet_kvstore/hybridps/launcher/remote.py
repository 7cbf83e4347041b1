"""Starting processes on other hosts through a remote-shell template, checking that
hosts answer, and finding the scheduler's address on a network interface."""
from __future__ import annotations

import concurrent.futures
import fcntl
import os
import shlex
import socket
import struct
import subprocess
from collections.abc import Mapping, Sequence

# {host} is replaced in every word; {command} must be a word of its own and becomes ONE
# argument: a command line for a POSIX shell on the remote host (ssh hands it to the
# remote login shell; "ip netns exec {host} sh -c {command}" to a local sh).
DEFAULT_REMOTE_SHELL = ("ssh -o BatchMode=yes -o ConnectTimeout=10 "
                        "-o StrictHostKeyChecking=accept-new {host} {command}")
# Seconds the remote wrapper gives a process group between SIGTERM and SIGKILL.
REMOTE_KILL_GRACE_S = 3

# Runs on the remote host. The process gets its own session (setsid: a process group we
# can signal whole); a watcher kills that group when our stdin closes -- hybridrun
# closing the pipe, ssh dropping the connection, or hybridrun dying -- and the wrapper
# kills it on SIGTERM/SIGINT/SIGHUP: SIGTERM to the group, SIGKILL after the grace (a
# timer bounds the wait for the leader; the loop then covers the rest of the group).
# When the process exits, what it left in its group is stopped too, so nothing
# outlives the job on any host.
_WRAPPER = """\
{secrets}
{cd}
exec 3<&0
setsid {command} </dev/null 3<&- &
pid=$!
stop() {{
  kill -TERM -$pid 2>/dev/null || return 0
  if [ "${{1:-}}" != watcher ]; then
    setsid sh -c "sleep {grace}; kill -KILL -$pid" >/dev/null 2>&1 </dev/null &
    timer=$!
    wait $pid 2>/dev/null
  fi
  n=0
  while kill -0 -$pid 2>/dev/null && [ $n -lt {ticks} ]; do sleep 0.1; n=$((n+1)); done
  kill -KILL -$pid 2>/dev/null
  [ -z "${{timer:-}}" ] || kill -TERM -$timer 2>/dev/null
  return 0
}}
trap 'stop; exit 143' TERM
trap 'stop; exit 130' INT
trap 'stop; exit 129' HUP
(while read -r _; do :; done; stop watcher) <&3 >/dev/null 2>&1 &
watch=$!
exec 3<&-
wait $pid
rc=$?
kill $watch 2>/dev/null
stop
exit $rc
"""


class TemplateError(Exception):
    """A remote-shell template without {host} or {command}."""


def check_template(template: str) -> list[str]:
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise TemplateError(f"--remote-shell {template!r}: {exc}") from exc
    if "{command}" not in words:
        raise TemplateError(f"--remote-shell {template!r}: needs {{command}} as a word "
                            "of its own, e.g. 'ssh {host} {command}'")
    if not any("{host}" in w for w in words):
        raise TemplateError(f"--remote-shell {template!r}: needs {{host}}")
    return words


def remote_argv(template: str, host: str, command_line: str) -> list[str]:
    """The local argv that runs ``command_line`` (shell syntax) on ``host``."""
    return [command_line if w == "{command}" else w.replace("{host}", host)
            for w in check_template(template)]


def wrapped_command(argv: Sequence[str], env: Mapping[str, str],
                    unset: Sequence[str], cwd: str, secrets: Sequence[str] = ()) -> str:
    """A shell command line that runs ``argv`` with ``env`` set and ``unset`` removed,
    in ``cwd`` when it exists there, under the wrapper above. The variables named in
    ``secrets`` are not on it: the wrapper reads them from its stdin first, one line each
    in that order (secret_lines), so that no command line, here or there, shows them."""
    env_words = ["env", *(f"-u {shlex.quote(name)}" for name in sorted(unset)),
                 *(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))]
    command = " ".join([*env_words, *(shlex.quote(a) for a in argv)])
    cd = (f"cd {shlex.quote(cwd)} 2>/dev/null || echo \"hybridrun: note: no folder "
          f"{cwd} on $(hostname); running in $(pwd)\" >&2")
    read = "\n".join(f"IFS= read -r {name} || {{ echo \"hybridrun: no {name} on stdin "
                     f"on $(hostname): does the --remote-shell forward stdin?\" >&2; exit 70; }}"
                     f"; export {name}" for name in secrets)
    script = _WRAPPER.format(secrets=read, cd=cd, command=command, grace=REMOTE_KILL_GRACE_S,
                             ticks=int(REMOTE_KILL_GRACE_S * 10))
    return "sh -c " + shlex.quote(script)


def secret_lines(env: Mapping[str, str], secrets: Sequence[str]) -> str:
    """What the wrapper of wrapped_command(..., secrets) reads from its stdin first."""
    return "".join(f"{env.get(name, '')}\n" for name in secrets)


def check_hosts(template: str, hosts: Sequence[str], timeout: float) -> list[str]:
    """Run ``true`` on every host at once; return one error line per host that failed."""
    def probe(host: str) -> str | None:
        argv = remote_argv(template, host, "true")
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, errors="replace", timeout=timeout,
                                  start_new_session=True)
        except FileNotFoundError:
            return f"host {host}: cannot run {argv[0]!r} (--remote-shell)"
        except subprocess.TimeoutExpired:
            return f"host {host}: no answer within {timeout:g} s through {shlex.join(argv)}"
        if done.returncode == 0:
            return None
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        detail = said[-1] if said else "it printed nothing"
        return (f"host {host} is unreachable: {shlex.join(argv)} exited with code "
                f"{done.returncode}: {detail}")

    if not hosts:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        return [e for e in pool.map(probe, hosts) if e]


class InterfaceError(Exception):
    pass


def interface_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def interface_ipv4(name: str) -> str:
    """IPv4 address of interface ``name`` on this machine."""
    if name not in interface_names():
        raise InterfaceError(f"--network-interface {name}: no such interface here "
                             f"(have: {', '.join(interface_names())})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise InterfaceError(f"--network-interface {name}: it has no IPv4 address "
                                 f"({os.strerror(exc.errno or 0)})") from exc
    return socket.inet_ntoa(packed[20:24])


def guess_scheduler_address(remote_hosts: Sequence[str]) -> str:
    """The local address that routes to the first resolvable remote host, else the
    first non-loopback interface address."""
    for host in remote_hosts:
        name = host.rsplit("@", 1)[-1]
        try:
            target = socket.gethostbyname(name)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((target, 9))
                address = sock.getsockname()[0]
        except OSError:
            continue
        if not address.startswith("127."):
            return address
    for name in interface_names():
        try:
            address = interface_ipv4(name)
        except InterfaceError:
            continue
        if not address.startswith("127."):
            return address
    raise InterfaceError("cannot find an address of this machine that the hosts can "
                         "reach; name one with --network-interface")
