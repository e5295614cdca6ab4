"""Scenario 9: silent corruption of one replica's chunk file.

Story: a file is written (two chunks) and fsync'd. On one replica, bytes in the
middle of the chunk file are flipped behind the storage service's back (size and
metadata unchanged). Reads through the Python API and the mount must still return
the right bytes (the block checksum catches the damage and another replica
serves); a read aimed at the damaged replica is refused with CHECKSUM_MISMATCH;
the damaged replica is then repaired from a good one, so the replicas are
byte-identical again and every chunk file matches its checksum.
"""

from __future__ import annotations

import os
import time

import pytest

from fs3.errors import Code
from fs3.testing.faults import (
    corrupt_chunk,
    list_chunk_files,
    read_replica,
    storage_target_dirs,
    target_node,
)
from fs3.testing.invariants import check_replicas, fault_cluster

pytestmark = [pytest.mark.fault, pytest.mark.integration]


@pytest.mark.timeout(200)
def test_silent_corruption_detected_and_repaired() -> None:
    with fault_cluster("corruption", seed=10) as sc:
        api = sc.api("writer")
        data = os.urandom((1 << 20) + 300_000)
        api.write("/precious", 0, data)
        ino = api.client.stat("/precious").st_ino
        dirs = storage_target_dirs(sc.pc)
        replicas = [
            cf
            for tid, d in sorted(dirs.items())
            for cf in list_chunk_files(d, tid, ino)
            if cf.index == 0
        ]
        assert len(replicas) == 3, replicas
        victim = replicas[1]
        off, orig = corrupt_chunk(victim, nbytes=64)
        sc.say(
            f"flipped 64 bytes at offset {off} of chunk {ino}:0 on target {victim.target_id} ({victim.path})"
        )
        fuse = sc.fuse("reader")
        for i in range(10):
            assert api.read("/precious", 0, len(data)) == data, f"API read {i} returned wrong bytes"
            assert fuse.read("/precious", 0, len(data)) == data, (
                f"FUSE read {i} returned wrong bytes"
            )
        detected = not any(f"chunk {ino}:0" in p for p in check_replicas(sc.pc))
        sc.say(
            "20 reads through the API and the mount returned the right bytes "
            f"({'the clients hit the damaged replica: already repaired' if detected else 'damage not hit yet'})"
        )
        code, _ = read_replica(sc.pc, victim.target_id, ino, 0, victim.length)
        sc.say(f"a read aimed at target {victim.target_id} answers code {code}")
        if not detected:
            assert code == Code.CHECKSUM_MISMATCH, code
        t = time.monotonic()
        deadline = t + 60
        while True:
            problems = check_replicas(sc.pc)
            if not problems:
                break
            assert time.monotonic() < deadline, "corrupt replica not repaired:\n" + "\n".join(
                problems
            )
            time.sleep(0.5)
        sc.say(
            f"target {victim.target_id} repaired {time.monotonic() - t:.1f}s after detection; replicas identical"
        )
        code, back = read_replica(sc.pc, victim.target_id, ino, 0, victim.length)
        assert code == 0 and back == data[: victim.length]
        log = sc.pc.log_path(target_node(victim.target_id)).read_text(errors="replace")
        assert "checksum mismatch" in log, "the storage node never logged the detection"
        sc.say(f"{target_node(victim.target_id)} logged the checksum mismatch and the repair")
        sc.start_workload()
        sc.progress(15, 30, "workload after the repair")
        problems = sc.final_checks()
        assert not problems, "\n".join(problems)
