"""A local peer of a storage node's region socket, run as another user (stdlib only).

The security tier runs this with ``/usr/bin/python3`` under other uids (the test
runner is root), so the storage node sees real, different peer credentials.

    shm_peer.py victim PATH SIZE SOCK REQHEX   create PATH (0600, filled with 0x5a), register it
                                               by descriptor, print the answer, wait for stdin EOF
    shm_peer.py fd SOCK REQHEX PATH MODE       open PATH (MODE r|rw|dir) and send that descriptor
    shm_peer.py raw SOCK HEX NFDS              send HEX bytes with NFDS descriptors of /dev/null

Prints ``answer <hex>`` (the node's serialized ErrorDetail) or ``oserror <errno>``.
"""

from __future__ import annotations

import os
import socket
import sys


def send(sock_path: str, data: bytes, fds: list[int]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(10)
        s.connect(sock_path)
        if fds:
            socket.send_fds(s, [data], fds)
        else:
            s.send(data)
        print("answer", s.recv(4096).hex(), flush=True)


def main(argv: list[str]) -> int:
    mode = argv[0]
    try:
        if mode == "victim":
            path, size, sock_path, req = argv[1], int(argv[2]), argv[3], bytes.fromhex(argv[4])
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"\x5a" * size)
            send(sock_path, req, [fd])
            sys.stdin.read()  # stay alive (the node drops regions of dead owners)
            os.unlink(path)
        elif mode == "fd":
            sock_path, req, path, how = argv[1], bytes.fromhex(argv[2]), argv[3], argv[4]
            flags = {"r": os.O_RDONLY, "rw": os.O_RDWR, "dir": os.O_RDONLY | os.O_DIRECTORY}[how]
            fd = os.open(path, flags)
            send(sock_path, req, [fd])
        elif mode == "raw":
            sock_path, data, n = argv[1], bytes.fromhex(argv[2]), int(argv[3])
            fds = [os.open("/dev/null", os.O_RDWR) for _ in range(n)]
            send(sock_path, data, fds)
        else:
            print("unknown mode", mode, file=sys.stderr)
            return 2
    except OSError as e:
        print("oserror", e.errno, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
