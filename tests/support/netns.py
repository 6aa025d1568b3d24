"""A network namespace joined to this host by a veth pair, for tests that cut a worker off for real
(packets dropped, connections hanging, no refusal): ``cut()`` takes the host's end of the link down,
``restore()`` brings it back. Addresses are link-local to the pair and exist only while it does."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def netns_available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


class NetnsLink:
    def __init__(self, name: str, index: int = 1) -> None:
        if not netns_available():
            pytest.skip("network namespaces need root and iproute2")
        self.name = name
        self.host_if, self.ns_if = f"{name[:10]}h", f"{name[:10]}n"
        self.host_ip = f"169.254.213.{4 * index + 1}"
        self.ns_ip = f"169.254.213.{4 * index + 2}"
        _ip("netns", "add", name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip("-n", name, "link", "set", self.ns_if, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            self.close()
            raise

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
