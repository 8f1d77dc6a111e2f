#!/usr/bin/env python3
"""fair.py SG_BIN LAYOUT [FLOODERS]: a victim's round-trip latency through staleguard alone and
while FLOODERS connections pipeline finds as fast as the proxy takes them (passthrough
namespace, replies read and dropped). The victim is its own process; the fake mongos is the
e2e harness's `--role upstream`."""
import os, socket, struct, subprocess, sys, tempfile, time, statistics, glob
DEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../target/release/deps')
E2E = os.environ.get('E2E_BIN') or sorted([f for f in glob.glob(DEPS + '/e2e-*') if not f.endswith('.d')], key=os.path.getmtime)[-1]

def bdoc(items):
    body = b''
    for k, v in items:
        if isinstance(v, str):
            s = v.encode() + b'\0'
            body += b'\x02' + k.encode() + b'\0' + struct.pack('<i', len(s)) + s
        elif isinstance(v, int):
            body += b'\x10' + k.encode() + b'\0' + struct.pack('<i', v)
    return struct.pack('<i', len(body) + 5) + body + b'\0'

def op_msg(rid, doc):
    payload = struct.pack('<I', 0) + b'\0' + doc
    return struct.pack('<iiii', 16 + len(payload), rid, 0, 2013) + payload

FIND = bdoc([('find', 'items'), ('$db', 'bench'), ('limit', 1)])

def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p

def recv_msg(s):
    head = b''
    while len(head) < 4:
        c = s.recv(4 - len(head))
        if not c: raise EOFError
        head += c
    n = struct.unpack('<i', head)[0]; rest = b''
    while len(rest) < n - 4:
        c = s.recv(n - 4 - len(rest))
        if not c: raise EOFError
        rest += c

def victim(addr, n, gap):
    s = socket.create_connection(addr); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for i in range(n):
        t = time.perf_counter(); s.sendall(op_msg(i + 1, FIND)); recv_msg(s); times.append(time.perf_counter() - t)
        time.sleep(gap)
    times.sort()
    return times[len(times) // 2] * 1e3, times[int(len(times) * 0.99)] * 1e3

def flooder(addr, stop_at):
    import threading
    s = socket.create_connection(addr)
    batch = b''.join(op_msg(1000 + i, FIND) for i in range(64))
    got = [0]
    def reader():
        try:
            while True:
                c = s.recv(1 << 16)
                if not c: return
                got[0] += len(c)
        except OSError: return
    threading.Thread(target=reader, daemon=True).start()
    sent = 0
    while time.time() < stop_at:
        s.sendall(batch); sent += 64
        # at most ~512 messages in flight: the proxy is never blocked on this client
        while sent * 229 - got[0] > 512 * 229 and time.time() < stop_at: time.sleep(0.0005)
    s.close()
    print(sent)

if __name__ == '__main__':
    if sys.argv[1] == '--victim':
        p50, p99 = victim(('127.0.0.1', int(sys.argv[2])), int(sys.argv[3]), 0.002)
        print(f'{p50:.3f} {p99:.3f}'); sys.exit()
    if sys.argv[1] == '--flood':
        flooder(('127.0.0.1', int(sys.argv[2])), float(sys.argv[3])); sys.exit()
    sg, layout = sys.argv[1], sys.argv[2]; flooders = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    up = subprocess.Popen([E2E, '--role', 'upstream'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    upaddr = up.stdout.readline().split()[1]
    port = free_port(); tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, 'sg.toml')
    open(cfg, 'w').write(f'listen = "127.0.0.1:{port}"\nupstreams = ["{upaddr}"]\nlayout = "{layout}"\n[admin]\nenabled = false\n')
    sgp = subprocess.Popen([sg, '--log-level', 'warn', 'run', '--config', cfg], stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, 'log'), 'w'))
    for _ in range(100):
        try: socket.create_connection(('127.0.0.1', port)).close(); break
        except OSError: time.sleep(0.05)
    me = sys.argv[0]
    base = subprocess.run([sys.executable, me, '--victim', str(port), '400'], capture_output=True, text=True).stdout.split()
    stop = time.time() + 6
    fl = [subprocess.Popen([sys.executable, me, '--flood', str(port), str(stop)], stdout=subprocess.PIPE, text=True) for _ in range(flooders)]
    time.sleep(1)
    hit = subprocess.run([sys.executable, me, '--victim', str(port), '400'], capture_output=True, text=True).stdout.split()
    sent = sum(int(f.communicate()[0].strip() or 0) for f in fl)
    print(f'{layout:8} flooders {flooders}: victim alone p50 {base[0]} ms p99 {base[1]} ms; flooded p50 {hit[0]} ms p99 {hit[1]} ms; flood {sent/5:.0f} msgs/s; load {open("/proc/loadavg").read().split()[0]}', flush=True)
    sgp.terminate(); up.terminate(); sgp.wait(); up.wait()
