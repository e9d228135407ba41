"""Hostfile parsing and include/exclude filters.

A hostfile lists one host per line as ``host slots=N``; ``#`` starts a comment and blank lines are
ignored. Filters use the ``host1:0,2@host2`` syntax: ``@`` separates hosts, ``:`` introduces the
slot indices to keep (or drop) on that host; a host without slots means all of its slots.
"""

from __future__ import annotations

import re
from pathlib import Path

from ds.interfaces.errors import ConfigError

# Ordered host -> slot indices. Order matters: it fixes node ranks and global ranks.
Resources = dict[str, list[int]]

_SLOTS = re.compile(r"^slots=(\d+)$")


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> Resources:
    """Parse hostfile ``text``; errors name ``source``, the line number and what is wrong."""
    hosts: Resources = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{where}: expected 'HOST slots=N', got {raw.strip()!r}")
        host, slots_field = parts
        match = _SLOTS.match(slots_field)
        if match is None:
            raise ConfigError(
                f"{where}: expected 'slots=N' after host {host!r}, got {slots_field!r}"
            )
        count = int(match.group(1))
        if count < 1:
            raise ConfigError(f"{where}: host {host!r} has slots={count}; slots must be >= 1")
        if host in hosts:
            raise ConfigError(f"{where}: host {host!r} is listed twice; list each host once")
        hosts[host] = list(range(count))
    if not hosts:
        raise ConfigError(f"{source}: no hosts found; add lines of the form 'HOST slots=N'")
    return hosts


def read_hostfile(path: str | Path) -> Resources:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"hostfile {str(p)!r} does not exist; pass an existing --hostfile"
        ) from None
    except OSError as exc:
        raise ConfigError(f"hostfile {str(p)!r} cannot be read: {exc.strerror}") from None
    return parse_hostfile_text(text, source=str(p))


def parse_filter(spec: str, flag: str) -> dict[str, list[int] | None]:
    """``host1:0,2@host2`` -> {host1: [0, 2], host2: None (all slots)}."""
    out: dict[str, list[int] | None] = {}
    for item in spec.split("@"):
        item = item.strip()
        if not item:
            raise ConfigError(f"{flag} {spec!r}: empty host entry; write 'host1:0,1@host2'")
        host, sep, slot_text = item.partition(":")
        host = host.strip()
        if not host:
            raise ConfigError(f"{flag} {spec!r}: entry {item!r} has no host name")
        if not sep:
            out[host] = None
            continue
        slots: list[int] = []
        for s in slot_text.split(","):
            s = s.strip()
            if not s.isdigit():
                raise ConfigError(
                    f"{flag} {spec!r}: slot {s!r} of host {host!r} is not a non-negative integer"
                )
            slots.append(int(s))
        prev = out.get(host)
        out[host] = sorted(set((prev or []) + slots))
    return out


def apply_filters(
    resources: Resources, include: str | None = None, exclude: str | None = None
) -> Resources:
    """Keep only the included hosts/slots, or drop the excluded ones (not both)."""
    if include and exclude:
        raise ConfigError("--include and --exclude are mutually exclusive; pass only one")
    if not include and not exclude:
        return {h: list(s) for h, s in resources.items()}
    flag = "--include" if include else "--exclude"
    wanted = parse_filter(include or exclude or "", flag)
    for host, slots in wanted.items():
        if host not in resources:
            known = ", ".join(resources) or "none"
            raise ConfigError(f"{flag}: unknown host {host!r} (known hosts: {known})")
        for s in slots or []:
            if s not in resources[host]:
                raise ConfigError(
                    f"{flag}: host {host!r} has no slot {s} (slots: "
                    f"{','.join(map(str, resources[host]))})"
                )
    out: Resources = {}
    if include:
        for host, avail in resources.items():
            if host in wanted:
                sel = wanted[host]
                out[host] = list(avail) if sel is None else [s for s in avail if s in sel]
    else:
        for host, avail in resources.items():
            if host not in wanted:
                out[host] = list(avail)
                continue
            sel = wanted[host]
            if sel is None:
                continue
            kept = [s for s in avail if s not in sel]
            if kept:
                out[host] = kept
    if not out:
        raise ConfigError(f"{flag} {include or exclude!r} leaves no hosts to run on")
    return out


def limit(resources: Resources, num_nodes: int | None, slots_per_node: int | None) -> Resources:
    """Keep the first ``num_nodes`` hosts and the first ``slots_per_node`` slots of each."""
    items = list(resources.items())
    if num_nodes is not None:
        if num_nodes < 1:
            raise ConfigError(f"--num_nodes {num_nodes}: must be >= 1")
        if num_nodes > len(items):
            raise ConfigError(
                f"--num_nodes {num_nodes}: only {len(items)} host(s) available after filters"
            )
        items = items[:num_nodes]
    if slots_per_node is not None:
        if slots_per_node < 1:
            raise ConfigError(f"--num_gpus/--nproc {slots_per_node}: must be >= 1")
        for host, slots in items:
            if slots_per_node > len(slots):
                raise ConfigError(
                    f"--num_gpus/--nproc {slots_per_node}: host {host!r} has only "
                    f"{len(slots)} slot(s)"
                )
        items = [(h, s[:slots_per_node]) for h, s in items]
    return dict(items)
