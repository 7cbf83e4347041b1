"""Hosts of a multi-host job: ``-H``/``--hostfile``/``--server-hosts`` parsing and
where each worker and server runs (colocated, dedicated or mixed deployment)."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Host names as ssh and ip-netns accept them: letters, digits, '.', '-', '_' (and an
# optional user@ in front, passed to the remote shell as part of the name).
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_.-]+@)?[A-Za-z0-9_][A-Za-z0-9_.-]*$")
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1"})

DEPLOYMENTS = ("colocated", "dedicated", "mixed")


class HostSpecError(Exception):
    """A bad -H value, hostfile or --server-hosts value; the message says which."""


@dataclass(frozen=True)
class HostSlots:
    name: str
    slots: int

    @property
    def is_local(self) -> bool:
        return self.name in LOCAL_NAMES


def _check_name(name: str, where: str) -> None:
    if not name:
        raise HostSpecError(f"{where}: empty host name")
    if not _HOST_RE.match(name):
        raise HostSpecError(f"{where}: {name!r} is not a valid host name")


def _parse_count(text: str, where: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostSpecError(f"{where}: {what} must be a positive integer, not {text!r}")
    return int(text)


def _no_duplicates(hosts: Sequence[HostSlots], where: str) -> list[HostSlots]:
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise HostSpecError(f"{where}: host {host.name!r} is listed twice")
        seen.add(host.name)
    return list(hosts)


def parse_host_list(text: str, option: str = "-H") -> list[HostSlots]:
    """``h1:4,h2:4`` (``h1`` alone means one slot) -> hosts in the given order."""
    if not text.strip():
        raise HostSpecError(f"{option}: no hosts given")
    hosts = []
    for item in text.split(","):
        item = item.strip()
        where = f"{option} entry {item!r}"
        if not item:
            raise HostSpecError(f"{option} {text!r}: empty entry (stray comma?)")
        name, sep, count = item.partition(":")
        _check_name(name, where)
        if ":" in count:
            raise HostSpecError(f"{where}: expected HOST or HOST:SLOTS")
        hosts.append(HostSlots(name, _parse_count(count, where, "slots") if sep else 1))
    return _no_duplicates(hosts, option)


def parse_hostfile(path: Path) -> list[HostSlots]:
    """Lines ``host slots=N`` (``host`` alone: one slot); ``#`` starts a comment."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostSpecError(f"--hostfile {path}: {exc.strerror or exc}") from exc
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        _check_name(words[0], where)
        slots = 1
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or key not in ("slots", "max_slots"):
                raise HostSpecError(f"{where}: unexpected {word!r}; lines read "
                                    "'HOST slots=N'")
            if key == "slots":
                slots = _parse_count(value, where, "slots")
        hosts.append(HostSlots(words[0], slots))
    if not hosts:
        raise HostSpecError(f"--hostfile {path}: no hosts in the file")
    return _no_duplicates(hosts, f"--hostfile {path}")


@dataclass(frozen=True)
class Placement:
    """Where each process of a multi-host job runs."""

    worker_hosts: list[str]   # host of each worker rank
    server_hosts: list[str]   # host of each server rank
    deployment: str           # colocated | dedicated | mixed
    extra_servers: int        # mixed: the last k server ranks are on extra hosts

    def local_placement(self, rank: int) -> tuple[int, int]:
        """(local rank, local size) of worker ``rank`` among the workers of its host."""
        host = self.worker_hosts[rank]
        same = [r for r, h in enumerate(self.worker_hosts) if h == host]
        return same.index(rank), len(same)


def _round_robin(count: int, hosts: Sequence[str]) -> list[str]:
    return [hosts[i % len(hosts)] for i in range(count)]


def place(*, hosts: Sequence[HostSlots], num_workers: int | None,
          num_servers: int | None, server_hosts: Sequence[HostSlots] | None,
          colocated: bool, backend_has_servers: bool) -> Placement:
    """Fill the hosts' slots with worker ranks in order, then place the servers.

    colocated (default without --server-hosts): one server per worker host, or
    --servers M spread round-robin over them. dedicated (--server-hosts): as many
    servers on each server host as its count, or --servers M spread round-robin.
    mixed (--colocated and --server-hosts): one server per worker host, then those of
    the server hosts, whose ranks come last.
    """
    total = sum(h.slots for h in hosts)
    if num_workers is None:
        num_workers = total
    if num_workers > total:
        listed = ", ".join(f"{h.name}:{h.slots}" for h in hosts)
        raise HostSpecError(f"-np {num_workers} is more than the {total} slots of the "
                            f"hosts ({listed})")
    worker_hosts = [h.name for h in hosts for _ in range(h.slots)][:num_workers]
    used = list(dict.fromkeys(worker_hosts))
    if not backend_has_servers:
        if server_hosts:
            raise HostSpecError("--server-hosts needs a backend with servers "
                                "(dist_allreduce has none)")
        return Placement(worker_hosts, [], "colocated", 0)
    extra = [h.name for h in server_hosts or []]
    overlap = sorted(set(extra) & set(used))
    if overlap:
        raise HostSpecError(f"--server-hosts {','.join(overlap)} also run workers; "
                            "list only dedicated server hosts there (use --colocated "
                            "for a server beside the workers)")
    if server_hosts and colocated:
        if num_servers is not None:
            raise HostSpecError("with --colocated and --server-hosts (mixed) there is one "
                                "server per worker host plus those of --server-hosts; "
                                "drop --servers")
        extras = [h.name for h in server_hosts for _ in range(h.slots)]
        return Placement(worker_hosts, used + extras, "mixed", len(extras))
    if server_hosts:
        per_host = [h.name for h in server_hosts for _ in range(h.slots)]
        servers = per_host if num_servers is None else _round_robin(num_servers, extra)
        return Placement(worker_hosts, servers, "dedicated", 0)
    servers = _round_robin(len(used) if num_servers is None else num_servers, used)
    return Placement(worker_hosts, servers, "colocated", 0)
