#!/usr/bin/env python3
"""What sockets left in TIME_WAIT cost the next job's binds (docs/scale.md, "Sockets left in TIME_WAIT").

Makes N loopback connections that the connecting side closes first (so that its socket stays in
TIME_WAIT for a minute), each dialled as Loom dialled before (a bind to port 0, which reserves the
port) or as it dials now (--no-port: IP_BIND_ADDRESS_NO_PORT, the port left to connect()), then
times K listeners' bind to port 0 and K dials of each kind. It leaves N sockets in TIME_WAIT for
a minute: run it on an idle machine, not beside a job.

  bench/port_search.py [--connections 22000] [--no-port] [--binds 500]
"""
import argparse
import re
import socket
import subprocess
import time

IP_BIND_ADDRESS_NO_PORT = 24  # linux/in.h


def dial(target, how):
    s = socket.socket()
    if how == "no-port":
        s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    if how != "no-bind":
        s.bind(("127.0.0.1", 0))
    s.connect(target)
    return s


def per_call_us(make, k):
    kept = []
    t0 = time.perf_counter()
    for _ in range(k):
        kept.append(make())
    took = time.perf_counter() - t0
    for s in kept:
        s.close()
    return took / k * 1e6


def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4096)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=22000)
    ap.add_argument("--no-port", action="store_true", help="fill TIME_WAIT with sockets that left the port to connect()")
    ap.add_argument("--binds", type=int, default=500)
    args = ap.parse_args()
    server = listener()
    how = "no-port" if args.no_port else "bind"
    for _ in range(args.connections):
        c = dial(server.getsockname(), how)
        a, _ = server.accept()
        c.close()  # the connecting side closes first: its socket goes to TIME_WAIT
        a.close()
    ss = subprocess.run(["ss", "-s"], capture_output=True, text=True).stdout
    found = re.search(r"timewait (\d+)", ss)
    waiting = found.group(1) if found else "?"
    target = listener()
    print(f"{args.connections} connections dialled with {how} (sockets in TIME_WAIT: {waiting})")
    print(f"  listener bind(0) + listen: {per_call_us(listener, args.binds):.0f} us each")
    for kind in ("bind", "no-port", "no-bind"):
        us = per_call_us(lambda: dial(target.getsockname(), kind), args.binds)
        print(f"  dial with {kind}: {us:.0f} us each")


if __name__ == "__main__":
    main()
