#!/usr/bin/env python3
"""trickle.py BIN [LAYOUT] [SIZE] [CHUNK] [GAP]: one client sends one SIZE-byte `ping`
(default 40,000,000) in CHUNK-byte writes (default 4096), GAP seconds apart (default 0.0002),
to staleguard (BIN, `layout = LAYOUT`, default per-core) with a governed namespace, so the
request is held whole; mongos is a socket here that reads everything and answers nothing.
Prints the proxy's CPU time (user + system) spent while the request arrived."""
import os, socket, struct, subprocess, sys, tempfile, threading, time

bin_ = sys.argv[1]
layout = sys.argv[2] if len(sys.argv) > 2 else "per-core"
size = int(sys.argv[3]) if len(sys.argv) > 3 else 40_000_000
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
gap = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0002


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# mongos: reads everything, answers nothing.
sink = socket.socket()
sink.bind(("127.0.0.1", 0))
sink.listen(16)


def drain(c):
    while c.recv(1 << 20):
        pass


def accept():
    while True:
        c, _ = sink.accept()
        threading.Thread(target=drain, args=(c,), daemon=True).start()


threading.Thread(target=accept, daemon=True).start()
port, admin = free_port(), free_port()
cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
cfg.write(f'listen = "127.0.0.1:{port}"\nlayout = "{layout}"\n'
          f'upstreams = ["127.0.0.1:{sink.getsockname()[1]}"]\nhealth_interval = "off"\n'
          'message_timeout = "120s"\n[[namespaces]]\npattern = "demo.inventory"\nmode = "fallback"\n'
          f'[admin]\nlisten = "127.0.0.1:{admin}"\n')
cfg.close()
proxy = subprocess.Popen([bin_, "run", "--config", cfg.name], stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
        break
    except OSError:
        time.sleep(0.05)


def cpu():
    f = open(f"/proc/{proxy.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def el(kind, key, value):
    return bytes([kind]) + key.encode() + b"\x00" + value


pad = b"\x01" * (size - 200)
items = (el(0x10, "ping", struct.pack("<i", 1))
         + el(0x05, "pad", struct.pack("<i", len(pad)) + b"\x00" + pad)
         + el(0x02, "$db", struct.pack("<i", 6) + b"admin\x00"))
doc = struct.pack("<i", len(items) + 5) + items + b"\x00"
body = struct.pack("<I", 0) + b"\x00" + doc
msg = struct.pack("<iiii", 16 + len(body), 1, 0, 2013) + body
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c0, t0 = cpu(), time.time()
for i in range(0, len(msg), chunk):
    s.sendall(msg[i:i + chunk])
    if gap:
        time.sleep(gap)
time.sleep(0.5)
print(f"{os.path.basename(bin_)} {layout}: {len(msg)} bytes in {chunk}-byte writes over "
      f"{time.time() - t0:.1f} s: proxy CPU {cpu() - c0:.2f} s")
proxy.kill()
os.unlink(cfg.name)
