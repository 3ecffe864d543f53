"""The test bed's DNS server: A, AAAA and SRV records from a JSON zone file, on a loopback port.

Run as ``python -m smartclient.testing.dns_server --port P --zone FILE``.
The zone file is re-read whenever its modification time changes, so a test
adds a record by rewriting the file (see :class:`ZoneFile`); no restart.

A record of type ``DROP`` makes the server stay silent for that name, so a
client sees a real DNS timeout.  Names not in the zone get NXDOMAIN.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["DnsRecord", "ZoneFile", "main"]

RECORD_TYPES = ("A", "AAAA", "SRV", "DROP")


@dataclass(frozen=True)
class DnsRecord:
    """One record. For SRV, ``value`` is ``"priority weight port target"``."""

    name: str
    type: str
    value: str
    ttl: int = 30

    def normalised(self) -> DnsRecord:
        name = self.name.lower().rstrip(".") + "."
        kind = self.type.upper()
        if kind not in RECORD_TYPES:
            raise ValueError(f"unsupported DNS record type {self.type!r}; use one of {RECORD_TYPES}")
        if self.ttl < 0:
            raise ValueError(f"negative TTL {self.ttl} for {self.name}")
        if kind == "SRV":
            parts = self.value.split()
            if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
                raise ValueError(f"SRV value {self.value!r} must be 'priority weight port target'")
        return DnsRecord(name, kind, self.value, self.ttl)


class ZoneFile:
    """The JSON file both the server and the tests read; writes are atomic (rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[DnsRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        return [DnsRecord(**item).normalised() for item in raw.get("records", [])]

    def write(self, records: Iterable[DnsRecord]) -> None:
        data = {"records": [asdict(r.normalised()) for r in records]}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def add(self, record: DnsRecord) -> None:
        self.write([*self.read(), record])

    def remove(self, name: str, type: str | None = None) -> None:
        wanted = name.lower().rstrip(".") + "."
        self.write(
            r for r in self.read() if not (r.name == wanted and (type is None or r.type == type.upper()))
        )


def _serve(port: int, zone: ZoneFile) -> None:  # pragma: no cover - exercised through the test bed
    from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSLabel
    from dnslib.server import BaseResolver, DNSError, DNSServer

    class ZoneResolver(BaseResolver):  # type: ignore[misc]
        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._stamp: tuple[int, int] = (-1, -1)
            self._records: list[DnsRecord] = []

        def _current(self) -> list[DnsRecord]:
            with self._lock:
                try:
                    st = zone.path.stat()
                    stamp = (st.st_ino, st.st_mtime_ns)
                except FileNotFoundError:
                    stamp = (0, 0)
                if stamp != self._stamp:  # the file is replaced by rename: a new inode
                    self._records = zone.read()
                    self._stamp = stamp
                return self._records

        def resolve(self, request: Any, handler: Any) -> Any:
            reply = request.reply()
            qname = str(request.q.qname).lower()
            qtype = QTYPE[request.q.qtype]
            records = [r for r in self._current() if r.name == qname]
            if any(r.type == "DROP" for r in records):
                raise DNSError(f"dropping query for {qname} (DROP record)")
            if not records:
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            for r in records:
                if r.type != qtype:
                    continue
                if r.type == "A":
                    rdata: Any = A(r.value)
                elif r.type == "AAAA":
                    rdata = AAAA(r.value)
                else:
                    prio, weight, port, target = r.value.split()
                    rdata = SRV(int(prio), int(weight), int(port), DNSLabel(target))
                reply.add_answer(RR(qname, getattr(QTYPE, r.type), rdata=rdata, ttl=r.ttl))
            return reply

    class QuietLogger:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    resolver = ZoneResolver()
    servers = [
        DNSServer(resolver, address="127.0.0.1", port=port, tcp=tcp, logger=QuietLogger())
        for tcp in (False, True)
    ]
    for server in servers:
        server.start_thread()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        time.sleep(0.2)
    for server in servers:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--zone", type=Path, required=True)
    parser.add_argument("--pidfile", type=Path)
    args = parser.parse_args(argv)
    if args.pidfile:
        args.pidfile.write_text(str(os.getpid()))
    _serve(args.port, ZoneFile(args.zone))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
