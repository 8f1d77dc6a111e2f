#!/usr/bin/env python3
"""mem.py SG_BIN LAYOUT PAIRS: staleguard's VmRSS idle, with PAIRS pairs that each carried one
find and were quiet 3 s, then after malloc_trim(0) called through gdb (what of it is memory
freed but kept by malloc)."""
import os, socket, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(__file__))
from fair import E2E, op_msg, FIND, free_port, recv_msg
sg, layout, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = dict(os.environ)
up = subprocess.Popen([E2E, '--role', 'upstream'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
upaddr = up.stdout.readline().split()[1]
port = free_port(); tmp = tempfile.mkdtemp(); cfg = os.path.join(tmp, 'sg.toml')
open(cfg, 'w').write(f'listen = "127.0.0.1:{port}"\nupstreams = ["{upaddr}"]\nlayout = "{layout}"\n[admin]\nenabled = false\n')
cmd = ([x for x in os.environ.get('SG_WRAP', '').split() if x]) + [sg, '--log-level', 'warn', 'run', '--config', cfg]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, 'log'), 'w'))
for _ in range(100):
    try: socket.create_connection(('127.0.0.1', port)).close(); break
    except OSError: time.sleep(0.05)
def rss(): return int([l for l in open(f'/proc/{p.pid}/status') if l.startswith('VmRSS')][0].split()[1])
time.sleep(0.5); idle = rss()
socks = []
for i in range(pairs):
    s = socket.create_connection(('127.0.0.1', port)); s.sendall(op_msg(1, FIND)); socks.append(s)
for s in socks: recv_msg(s)
time.sleep(3); loaded = rss()
subprocess.run(['gdb', '-p', str(p.pid), '-batch', '-ex', 'call (int)malloc_trim(0)'], capture_output=True)
time.sleep(0.3); trimmed = rss()
print(f'{layout}: idle {idle/1024:.1f} MiB, {pairs} pairs {loaded/1024:.1f} MiB ({(loaded-idle)/pairs:.1f} KiB/pair), after malloc_trim {trimmed/1024:.1f} MiB ({(trimmed-idle)/pairs:.1f} KiB/pair)')
p.terminate(); up.terminate()
