#!/usr/bin/env python3
"""heap.py SG_BIN PAIRS [HEAPTRACK_RAW]: where an idle pair's memory goes. Starts the e2e fake
mongos and SG_BIN with the e2e harness's config (the governed namespace), opens PAIRS client
connections that each do the driver's isMaster (in batches of 128) and one governed find (the find the e2e
harness sends, in chunks of 256 as it does), waits 3 s, and prints VmRSS and glibc's own
count of the bytes its heap holds in use (`malloc_stats()`, called in the proxy through
gdb), idle and loaded, per pair, and VmRSS again after `malloc_trim(0)` (what of it is
memory freed but kept by malloc).

With HEAPTRACK_RAW (a path) the proxy runs with heaptrack's preload writing its raw trace
there, and is killed (SIGKILL) while the pairs are held: what was allocated and not freed
then is what was live at that moment. The script interprets the trace (heaptrack_interpret,
heaptrack_print) and prints those bytes per pair, by allocating site: each stack's three
innermost frames that are not the allocator's (Vec, Box, Arc, hashbrown internals).
"""
import collections, os, re, signal, socket, struct, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(__file__))
from fair import E2E, free_port, recv_msg

def cstr(s): return s.encode() + b'\0'
def bdoc(items):
    body = b''
    for k, v in items:
        t, payload = v
        body += bytes([t]) + cstr(k) + payload
    return struct.pack('<i', len(body) + 5) + body + b'\0'
def s(v): b = cstr(v); return (0x02, struct.pack('<i', len(b)) + b)
def i32(v): return (0x10, struct.pack('<i', v))
def i64(v): return (0x12, struct.pack('<q', v))
def true(): return (0x08, b'\x01')
def doc(items): return (0x03, bdoc(items))
def binary(sub, data): return (0x05, struct.pack('<i', len(data)) + bytes([sub]) + data)
def ts(t, i): return (0x11, struct.pack('<II', i, t))

def op_msg(rid, body):
    payload = struct.pack('<I', 0) + b'\0' + body
    return struct.pack('<iiii', 16 + len(payload), rid, 0, 2013) + payload

HELLO = bdoc([('isMaster', i32(1)), ('helloOk', true()), ('$db', s('admin'))])
# benches/common/msgs.rs find_body("demo", "store_ledger")
FIND = bdoc([
    ('find', s('store_ledger')),
    ('filter', doc([('sku', s('A-1042-BLU')), ('qty', doc([('$gt', i32(0))])), ('store', i32(1187))])),
    ('limit', i64(10)),
    ('$db', s('demo')),
    ('lsid', doc([('id', binary(4, bytes([0x5a, 0x1f, 0x93, 0x0c, 0x4e, 0x2b, 0x4d, 0x11, 0x9a, 0x6e, 0x0b, 0x73, 0x21, 0xc4, 0x8f, 0x02])))])),
    ('$clusterTime', doc([('clusterTime', ts(1_764_400_000, 7)),
                          ('signature', doc([('hash', binary(0, b'\x3c' * 20)), ('keyId', i64(7_312_345_678_901_234_567))]))])),
    ('$readPreference', doc([('mode', s('secondaryPreferred'))])),
])

sg, pairs = sys.argv[1], int(sys.argv[2])
raw = sys.argv[3] if len(sys.argv) > 3 else None
up = subprocess.Popen([E2E, '--role', 'upstream'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
upaddr = up.stdout.readline().split()[1]
port = free_port(); tmp = tempfile.mkdtemp(); cfg = os.path.join(tmp, 'sg.toml')
open(cfg, 'w').write(
    f'listen = "127.0.0.1:{port}"\nupstreams = ["{upaddr}"]\n'
    + os.environ.get('SG_EXTRA', '') + '\n'
    '[[namespaces]]\npattern = "demo.store_inventory"\nmode = "fallback"\n\n'
    '[[namespaces]]\npattern = "demo.store_ledger"\nmode = "fallback"\n\n'
    '[[namespaces]]\npattern = "pay.*"\nmode = "strict"\n')
env = dict(os.environ)
env.pop('RUST_LOG', None)
if raw:
    env['LD_PRELOAD'] = '/usr/lib/heaptrack/libheaptrack_preload.so'
    env['DUMP_HEAPTRACK_OUTPUT'] = raw
log = os.path.join(tmp, 'log')
p = subprocess.Popen([sg, '--log-level', 'info', 'run', '--config', cfg], stdout=subprocess.DEVNULL,
                     stderr=open(log, 'w'), env=env)
for _ in range(200):
    try: socket.create_connection(('127.0.0.1', port)).close(); break
    except OSError: time.sleep(0.05)

def rss(): return int([l for l in open(f'/proc/{p.pid}/status') if l.startswith('VmRSS')][0].split()[1])
def in_use():
    """glibc's bytes in use over all arenas (malloc_stats' last "in use bytes")."""
    before = os.path.getsize(log)
    subprocess.run(['gdb', '-p', str(p.pid), '-batch', '-ex', 'call (void)malloc_stats()'], capture_output=True)
    time.sleep(0.2)
    with open(log) as f:
        f.seek(before); out = f.read()
    found = re.findall(r'in use bytes\s*=\s*(\d+)', out)
    return int(found[-1]) // 1024 if found else -1

time.sleep(0.5)
idle, idle_heap = rss(), (in_use() if not raw else -1)
socks = []
# Connected (each with its isMaster) in batches of 128, as the e2e harness does.
for i in range(0, pairs, 128):
    batch = []
    for _ in range(min(128, pairs - i)):
        c = socket.create_connection(('127.0.0.1', port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sendall(op_msg(1, HELLO)); batch.append(c)
    for c in batch: recv_msg(c)
    socks += batch
# The finds in chunks of 256, as the e2e harness sends them.
for i in range(0, len(socks), 256):
    for c in socks[i:i + 256]: c.sendall(op_msg(2, FIND))
    for c in socks[i:i + 256]: recv_msg(c)
time.sleep(3)
loaded = rss()
per = lambda a, b: (a - b) / max(pairs, 1)

# Allocator frames, skipped when naming an allocating site.
ALLOC = re.compile(r'^(alloc::|<alloc::|core::|<core::|std::sys|<std::alloc|__rust|__rdl|_<alloc::|'
                   r'hashbrown::raw|bytes::bytes_mut::BytesMut::(reserve|with_capacity|shallow|promote)|'
                   r'std::alloc|malloc|tokio::loom|<tokio::loom|sharded_slab::page|<\[)')

def sites(raw, pairs, depth=3, top=24):
    """Bytes live at the kill per pair, by allocating site."""
    gz = raw + '.gz'
    with open(raw, 'rb') as f, open(gz, 'wb') as out:
        interp = subprocess.Popen(['/usr/lib/heaptrack/libexec/heaptrack_interpret'], stdin=f, stdout=subprocess.PIPE)
        subprocess.run(['gzip'], stdin=interp.stdout, stdout=out, check=True)
        interp.wait()
    stacks = raw + '.stacks'
    subprocess.run(['heaptrack_print', '-f', gz, '--flamegraph-cost-type', 'leaked', '-F', stacks],
                   capture_output=True, check=True)
    rows = []
    for line in open(stacks):
        stack, _, n = line.rstrip('\n').rpartition(' ')
        if int(n):
            rows.append(([f for f in stack.split(';') if f], int(n)))
    frames = sorted({f for fr, _ in rows for f in fr})
    names = subprocess.run(['c++filt'], input='\n'.join(re.sub(r' \(.*\)$', '', f) for f in frames),
                           capture_output=True, text=True).stdout.split('\n')
    def tidy(s):
        s = re.sub(r'::h[0-9a-f]{16}$', '', re.sub(r'\[[0-9a-f]+\]', '', s))
        for a, b in [('$LT$', '<'), ('$GT$', '>'), ('$u7b$$u7b$closure$u7d$$u7d$', '{closure}'),
                     ('$C$', ','), ('..', '::'), ('$u20$', ' '), ('$RF$', '&')]:
            s = s.replace(a, b)
        return s
    name = {f: tidy(n) for f, n in zip(frames, names)}
    by_site = collections.Counter()
    for fr, n in rows:
        own = [name[f] for f in reversed(fr) if not ALLOC.search(name[f])]
        by_site[' < '.join(own[:depth])] += n
    total = sum(by_site.values())
    print(f'live at the kill: {total / pairs:.0f} bytes per pair, by allocating site:')
    for site, n in by_site.most_common(top):
        print(f'{n / pairs:8.1f}  {site[:300]}')

if raw:
    print(f'VmRSS idle {idle} KiB, {pairs} pairs {loaded} KiB ({per(loaded, idle):.2f} KiB/pair); killing for the trace')
    p.send_signal(signal.SIGKILL); p.wait()
    up.terminate()
    sites(raw, max(pairs, 1))
else:
    heap = in_use()
    subprocess.run(['gdb', '-p', str(p.pid), '-batch', '-ex', 'call (int)malloc_trim(0)'], capture_output=True)
    time.sleep(0.3)
    trimmed = rss()
    print(f'VmRSS idle {idle} KiB, {pairs} pairs {loaded} KiB ({per(loaded, idle):.2f} KiB/pair; '
          f'{per(trimmed, idle):.2f} after malloc_trim); '
          f'heap in use idle {idle_heap} KiB, loaded {heap} KiB ({per(heap, idle_heap):.2f} KiB/pair)')
    p.terminate(); p.wait()
up.terminate()
