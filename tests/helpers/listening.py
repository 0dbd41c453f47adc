"""The TCP sockets a set of processes listens on, read from ``/proc`` (no ``ss`` needed): for
the tests that a one-machine data-parallel job listens on loopback only."""

from __future__ import annotations

import os


def _listdir(path: str) -> list[str]:
    """The names in a ``/proc`` folder; none where the process or task is gone."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for name in _listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        text = ".".join(str(b) for b in reversed(raw))
    else:  # /proc/net/tcp6: four little-endian 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        flat = b"".join(words)
        text = ":".join(flat[i : i + 2].hex() for i in range(0, 16, 2))
        text = {"0000:0000:0000:0000:0000:0000:0000:0000": "::", "0000:0000:0000:0000:0000:0000:0000:0001": "::1"}.get(
            text, text
        )
    return f"{text}:{int(port, 16)}"


def children(pid: int) -> set[int]:
    found = set()
    for task in _listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return found


def listening(pids: set[int]) -> list[str]:
    """``address:port`` of every listening TCP socket the processes hold."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids)) if pids else set()
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return sorted(found)


def loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host.startswith("127.") or host == "::1"
