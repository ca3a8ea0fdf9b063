#!/usr/bin/env python3
"""A loopback TCP proxy that makes s3s-fs answer without delayed-ACK stalls.

s3s-fs writes a response's head and body separately with Nagle's algorithm on, so the body
waits for the client to ACK the head, and Linux delays that ACK by up to 40 ms. Every GET then
takes 20-40 ms on loopback. This proxy ACKs the server at once (TCP_QUICKACK, re-armed before
every read, as Linux clears it) and forwards with TCP_NODELAY, so a request costs what the
server's work costs.

With DELAY_MS, every HTTP request the client sends is held that long before it is forwarded,
as a remote store's round trip would: one delay per request, and connections do not wait for
each other, so concurrent requests overlap as they would against a real store.

With LAKECACHE_S3_LATENCY_SPREAD=s3, each request's hold is drawn as the testkit's
`LatencyStore::s3_like` draws it (one request per wait): log-normal with sigma 0.5 around
DELAY_MS (its median), and one request in a hundred 20 times longer, from a fixed seed.

With LAKECACHE_PROXY_COUNTS naming a file, the method of every request is appended to it, one
per line: how benchmarks count the requests of clients that count none themselves.

usage: tcp-proxy.py LISTEN_PORT TARGET_PORT [DELAY_MS]
"""
import math
import os
import random
import socket
import sys
import threading
import time

METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")
COUNTS = os.environ.get("LAKECACHE_PROXY_COUNTS")
COUNTS_LOCK = threading.Lock()
S3_LIKE = os.environ.get("LAKECACHE_S3_LATENCY_SPREAD") == "s3"
DRAWS = random.Random(7)
DRAWS_LOCK = threading.Lock()


def hold(median):
    """How long one request is held: `median`, or an S3-like draw around it."""
    if not S3_LIKE:
        return median
    with DRAWS_LOCK:
        wait = median * math.exp(0.5 * DRAWS.gauss(0.0, 1.0))
        if DRAWS.random() < 0.01:
            wait *= 20
    return wait


def count(data):
    if COUNTS is None:
        return
    with COUNTS_LOCK, open(COUNTS, "ab") as f:
        f.write(data.split(b" ", 1)[0] + b"\n")


def pipe(src, dst, quickack, delay):
    # `quickack` marks the server-to-client direction: requests flow the other way.
    try:
        while True:
            if quickack:
                src.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            data = src.recv(1 << 16)
            if not data:
                break
            if not quickack and data.startswith(METHODS):
                count(data)
                if delay:
                    time.sleep(hold(delay))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listen_port, target_port, delay):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(128)
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pipe, args=(client, upstream, False, delay), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client, True, 0), daemon=True).start()


if __name__ == "__main__":
    delay_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    serve(int(sys.argv[1]), int(sys.argv[2]), delay_ms / 1000.0)
