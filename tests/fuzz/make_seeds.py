#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz (corpus/<target>/): well-formed inputs from which libFuzzer
mutates. Run again after a format changes: python3 tests/fuzz/make_seeds.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
COLL = 0x80000000  # kCollectiveTagBit


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# --- tcp_frames: flags, receive descriptors, then (control, bytes) chunks (tcp_frames_fuzz.cc) ---
def frame(ftype, tag=0, seq=0, a=0, b=0, flags=0):
    return struct.pack("<HBBIQQQ", 0x4D4C, ftype, flags, tag, seq, a, b)


EAGER, RTS, CTS, DATA, READY, PUSH, BYE = 1, 2, 3, 4, 5, 6, 7


def tcp_input(two_streams, receives, send, chunks):
    """receives: (tag selector, size selector) pairs; chunks: (stream, bytes)."""
    out = bytes([(1 if two_streams else 0) | (len(receives) << 1) | (8 if send else 0)])
    for tagsel, sizesel in receives:
        out += bytes([tagsel, sizesel])
    for stream, data in chunks:
        for i in range(0, len(data), 128):
            piece = data[i:i + 128]
            out += bytes([((len(piece) - 1) << 1) | stream]) + piece
    return out


payload = bytes(range(256)) * 8
write("tcp_frames", "eager", tcp_input(False, [(1, 1)], False, [(0, frame(EAGER, 1, 0, 200) + payload[:200])]))
write("tcp_frames", "eager_unexpected",
      tcp_input(False, [], False, [(0, frame(EAGER, 3, 0, 100) + payload[:100] + frame(EAGER, 3, 1, 0))]))
write("tcp_frames", "rts_data",
      tcp_input(False, [(2, 8)], False,
                [(0, frame(RTS, 2, 0, 2000) + frame(DATA, 0, 0, 0, 2000) + payload[:2000])]))
write("tcp_frames", "push_striped",
      tcp_input(True, [(5, 8)], False,
                [(0, frame(PUSH, COLL | 1, 0, 1500) + frame(DATA, 0, 0, 0, 750) + payload[:750]),
                 (1, frame(DATA, 0, 0, 750, 750) + payload[750:1500])]))
write("tcp_frames", "data_before_push",
      tcp_input(True, [(5, 8)], False,
                [(1, frame(DATA, 0, 0, 750, 750) + payload[750:1500]),
                 (0, frame(PUSH, COLL | 1, 0, 1500) + frame(DATA, 0, 0, 0, 750) + payload[:750])]))
write("tcp_frames", "cts_for_send", tcp_input(False, [], True, [(0, frame(CTS, 0, 0, 0, 0, 1))]))
write("tcp_frames", "cts_refused", tcp_input(False, [], True, [(0, frame(CTS, 0, 0, 0, 0x1234, 2))]))
write("tcp_frames", "ready", tcp_input(False, [(1, 1)], True, [(0, frame(READY, 1, 0, 4096, 0))]))
reason = b"rank 1 failed: an injected fault"
write("tcp_frames", "bye", tcp_input(False, [(1, 1)], False, [(0, frame(BYE, 0, 0, len(reason), 0, 1) + reason)]))
write("tcp_frames", "rts_too_big", tcp_input(False, [(2, 1)], False, [(0, frame(RTS, 2, 0, 100000))]))
# Receives with a consumer (tag selector bit 3; bits 4-5: element size 1, 2, 4, 8): eager, after
# RTS/CTS, pushed and striped at 64-byte slices, and a slice that does not start at a whole element.
CONSUME4, CONSUME8 = 8 | (2 << 4), 8 | (3 << 4)
write("tcp_frames", "consume_eager",
      tcp_input(False, [(1 | CONSUME8, 1)], False, [(0, frame(EAGER, 1, 0, 200) + payload[:200])]))
write("tcp_frames", "consume_rts_data",
      tcp_input(False, [(2 | CONSUME4, 8)], False,
                [(0, frame(RTS, 2, 0, 2000) + frame(DATA, 0, 0, 0, 2000) + payload[:2000])]))
write("tcp_frames", "consume_push_striped",
      tcp_input(True, [(5 | CONSUME8, 8)], False,
                [(0, frame(PUSH, COLL | 1, 0, 1504) + frame(DATA, 0, 0, 0, 768) + payload[:768]),
                 (1, frame(DATA, 0, 0, 768, 736) + payload[768:1504])]))
write("tcp_frames", "consume_unaligned_slice",
      tcp_input(True, [(5 | CONSUME8, 8)], False,
                [(0, frame(PUSH, COLL | 1, 0, 1500) + frame(DATA, 0, 0, 0, 750) + payload[:750]),
                 (1, frame(DATA, 0, 0, 750, 750) + payload[750:1500])]))

# --- store_request: length-prefixed requests (store_protocol.hpp) ---
def store_req(op, key, value=b""):
    body = bytes([op]) + struct.pack("<I", len(key)) + key + value
    return struct.pack("<I", len(body)) + body


write("store_request", "set_get_add",
      store_req(1, b"rank/0", b"\x01\x02\x03") + store_req(2, b"rank/0") + store_req(3, b"counter", struct.pack("<q", 1)))
write("store_request", "empty_key", store_req(2, b""))
write("store_request", "wait", store_req(6, b"joined/all", struct.pack("<I", 250)))

# --- store_server: byte 0 bit 0 = authenticate first, then raw bytes (store_server_fuzz.cc) ---
write("store_server", "requests", b"\x01" + store_req(1, b"k", b"v") + store_req(2, b"k") +
      store_req(3, b"n", struct.pack("<q", 5)))
write("store_server", "wait_then_set", b"\x01" + store_req(6, b"w", struct.pack("<I", 100)) + store_req(1, b"w", b"v") +
      store_req(6, b"w", struct.pack("<I", 60000)))
write("store_server", "client_hello_wrong_mac", b"\x00LOOMSTC1" + bytes(range(16)) + bytes(32))
write("store_server", "http", b"\x00GET / HTTP/1.0\r\n\r\n")
write("store_server", "huge_length", b"\x01" + struct.pack("<I", 0xFFFFFFF0) + b"\x01")

# --- unique_id: 128 bytes, magic LMID, version 1, store address, key, communicator id ---
uid = bytearray(128)
uid[0:4] = b"LMID"
uid[4] = 1
uid[8] = 4
uid[10:12] = struct.pack(">H", 29500)
uid[12:16] = bytes([127, 0, 0, 1])
uid[28:60] = bytes(range(32))
uid[60:76] = bytes(range(100, 116))
write("unique_id", "ipv4", bytes(uid))
uid6 = bytearray(uid)
uid6[8] = 6
uid6[12:28] = bytes(15) + b"\x01"
write("unique_id", "ipv6", bytes(uid6))

# --- hostlist ---
for i, text in enumerate(["node[01-04,07]", "gpu-a[1-2]-ib,login1,c[3]", "r[1-2]n[01-02]", "127.0.0.[1-4]", "a,b"]):
    write("hostlist", "list%d" % i, text)

# --- ifname: LOOM_SOCKET_IFNAME syntax ---
for i, text in enumerate(["eth0", "^docker,lo", "=eth0,ib0", "^=lo", "en,ib"]):
    write("ifname", "spec%d" % i, text)

# --- launcher_env: NAME=VALUE lines ---
write("launcher_env", "slurm",
      "SLURM_PROCID=1\nSLURM_NTASKS=4\nSLURM_LOCALID=1\nSLURM_STEP_NODELIST=node[01-02]\nSLURM_JOB_ID=77\nSLURM_STEP_ID=0\nSLURM_TASKS_PER_NODE=2(x2)\nSLURM_NODEID=0\n")
write("launcher_env", "ompi",
      "OMPI_COMM_WORLD_RANK=2\nOMPI_COMM_WORLD_SIZE=4\nOMPI_COMM_WORLD_LOCAL_RANK=0\n"
      "OMPI_MCA_orte_hnp_uri=1234.0;tcp://10.0.0.1:4567\n")
write("launcher_env", "torchrun", "RANK=0\nWORLD_SIZE=2\nLOCAL_RANK=0\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\n")
write("launcher_env", "loom", "LOOM_RANK=3\nLOOM_WORLD_SIZE=8\nLOOM_MASTER_ADDR=127.0.0.1\nLOOM_MASTER_PORT=29500\n")

# --- flight_record: "seq sig state algo startAge endAge" lines (flight_recorder.cc) ---
write("flight_record", "ranks",
      "1 72340172838076673 done ring 2.500000 2.400000\n2 72340172838076673 done ring 1.000000 0.900000\n"
      "3 144680345676153346 running tree 0.500000 0.000000\n4 0 queued - 0.100000 0.000000\n"
      "5 3 failed direct 0.050000 0.010000\n")
