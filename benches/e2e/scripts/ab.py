#!/usr/bin/env python3
"""ab.py PASSES CONNS TARGET BIN...: for each pass, each BIN in turn (order rotated per pass):
one e2e run of HAProxy and TARGET (3 rounds of 1 s, CONNS connections, E2E_COUNT), printing
per-round CPU ratios to HAProxy, their median, p99 ratio and syscalls/cs per round trip, and
the req/s ratio with the other two processes' CPU per round trip (load generator + fake mongos)
beside HAProxy's.
Env: E2E_SG_LAYOUT etc. pass through."""
import os, re, subprocess, sys, statistics
passes, conns, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
bins = sys.argv[4:]
DEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../target/release/deps')
# The harness: E2E_BIN, or the newest `cargo bench --bench e2e --no-run` build.
e2e = os.environ.get('E2E_BIN') or sorted(
    [os.path.join(DEPS, f) for f in os.listdir(DEPS)
     if f.startswith('e2e-') and not f.endswith('.d')], key=os.path.getmtime)[-1]
# A bare name is a binary in BINS (default: the current directory).
BINS = os.environ.get('BINS', '.')
line = re.compile(r'round (\d+)/\d+\] (\S+)\s+(\d+) req/s.*?p99\s+([\d.]+) µs.*?cpu\s+([\d.]+) µs/rt(?:.*?syscalls/rt ([\d.]+)\s+cs/rt ([\d.]+)\+([\d.]+))?')
for p in range(passes):
    order = bins[p % len(bins):] + bins[:p % len(bins)]
    for b in order:
        path = os.path.abspath(b if '/' in b else os.path.join(BINS, b))
        env = dict(os.environ, E2E_NO_INSTALL='1', E2E_SG_BIN=path, E2E_COUNT=os.environ.get('E2E_COUNT', '1'),
                   E2E_TARGETS='haproxy,' + target, E2E_CONNS=conns,
                   E2E_ROUNDS=os.environ.get('E2E_ROUNDS', '3'), E2E_SECS=os.environ.get('E2E_SECS', '1'),
                   E2E_WARMUP=os.environ.get('E2E_WARMUP', '0.3'))
        load = open('/proc/loadavg').read().split()[0]
        out = subprocess.run([e2e, '--no-memory', '--no-micro'], env=env, capture_output=True, text=True)
        rounds = {}
        for m in line.finditer(out.stderr):
            peers = re.search(r'load gen\s+([\d.]+) µs/rt\s+mongos\s+([\d.]+) µs/rt', out.stderr[m.start():].split('\n', 1)[0])
            rounds.setdefault(m.group(1), {})[m.group(2)] = m.groups()[2:] + ((float(peers.group(1)) + float(peers.group(2))) if peers else None,)
        ratios, p99s, sg, hp, sc, rps, pe = [], [], [], [], [], [], []
        for r in rounds.values():
            if 'haproxy' in r and target in r:
                h, s = r['haproxy'], r[target]
                ratios.append(float(s[2]) / float(h[2])); p99s.append(float(s[1]) / float(h[1]))
                sg.append(float(s[2])); hp.append(float(h[2]))
                rps.append(float(s[0]) / float(h[0]))
                if s[6] is not None and h[6] is not None: pe.append((s[6], h[6]))
                if s[3]: sc.append((float(s[3]), float(h[3]), float(s[4]) + float(s[5]), float(h[4]) + float(h[5])))
        if not ratios:
            print(f'pass {p+1} {b}: no result\n{out.stderr[-1500:]}', flush=True); continue
        med = statistics.median
        extra = ''
        if sc:
            extra = ' syscalls/rt sg %.2f hp %.2f  cs/rt sg %.2f hp %.2f' % tuple(med([x[i] for x in sc]) for i in range(4))
        if pe:
            extra += '  peers sg %.2f hp %.2f µs/rt' % (med([x[0] for x in pe]), med([x[1] for x in pe]))
        print(f'pass {p+1} load {load} {os.path.basename(b):10} cpu sg {med(sg):6.2f} hp {med(hp):6.2f} µs/rt  ratio {med(ratios):.2f} [{" ".join("%.2f" % x for x in ratios)}]  req/s ratio {med(rps):.2f}  p99 ratio {med(p99s):.2f}{extra}', flush=True)
