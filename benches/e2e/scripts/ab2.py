#!/usr/bin/env python3
"""ab2.py PASSES LABEL=BIN[@LAYOUT]...: each pass, each config in turn (rotated per pass): one e2e
run of HAProxy and staleguard's three paths at E2E_CONNS (default 1,64), E2E_ROUNDS (3) rounds of
E2E_SECS (1) s; prints per target and connection count the median over rounds of CPU µs/rt, the
ratio to HAProxy's CPU in the same round, req/s ratio and p99 ratio."""
import os, re, subprocess, sys, statistics
passes = int(sys.argv[1]); cfgs = [a.split('=', 1) for a in sys.argv[2:]]
DEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../target/release/deps')
# The harness: E2E_BIN, or the newest `cargo bench --bench e2e --no-run` build.
e2e = os.environ.get('E2E_BIN') or sorted(
    [os.path.join(DEPS, f) for f in os.listdir(DEPS)
     if f.startswith('e2e-') and not f.endswith('.d')], key=os.path.getmtime)[-1]
# A bare name is a binary in BINS (default: the current directory).
BINS = os.environ.get('BINS', '.')
rx = re.compile(r'\[\s*(\d+) conns, round (\d+)/\d+\] (\S+)\s+(\d+) req/s.*?p99\s+([\d.]+) µs.*?cpu\s+([\d.]+) µs/rt(?:.*?syscalls/rt ([\d.]+)\s+cs/rt ([\d.]+)\+([\d.]+))?')
targets = os.environ.get('AB_TARGETS', 'staleguard-governed,staleguard,staleguard-rewrite')
med = statistics.median
for p in range(passes):
    order = cfgs[p % len(cfgs):] + cfgs[:p % len(cfgs)]
    for label, spec in order:
        b, _, layout = spec.partition('@')
        path = os.path.abspath(b if '/' in b else os.path.join(BINS, b))
        env = dict(os.environ, E2E_NO_INSTALL='1', E2E_SG_BIN=path,
                   E2E_TARGETS='haproxy,' + targets, E2E_CONNS=os.environ.get('E2E_CONNS', '1,64'),
                   E2E_ROUNDS=os.environ.get('E2E_ROUNDS', '3'), E2E_SECS=os.environ.get('E2E_SECS', '1'),
                   E2E_WARMUP=os.environ.get('E2E_WARMUP', '0.3'))
        if layout: env['E2E_SG_LAYOUT'] = layout
        load = open('/proc/loadavg').read().split()[0]
        out = subprocess.run([e2e, '--no-memory', '--no-micro'], env=env, capture_output=True, text=True)
        rows = {}
        for m in rx.finditer(out.stderr):
            c, r, t = m.group(1), m.group(2), m.group(3)
            rows.setdefault((c, r), {})[t] = [float(x) if x else None for x in m.groups()[3:]]
        if not rows:
            print(f'pass {p+1} {label}: no result\n{out.stderr[-1500:]}', flush=True); continue
        conns = sorted({c for c, _ in rows}, key=int)
        for c in conns:
            for t in targets.split(','):
                rs = [v for (cc, _), v in rows.items() if cc == c and t in v and 'haproxy' in v]
                if not rs: continue
                cpu = med([v[t][2] for v in rs]); rc = med([v[t][2] / v['haproxy'][2] for v in rs])
                rq = med([v[t][0] / v['haproxy'][0] for v in rs]); rp = med([v[t][1] / v['haproxy'][1] for v in rs])
                extra = ''
                if rs[0][t][3] is not None:
                    extra = '  sys/rt %.2f cs/rt %.2f' % (med([v[t][3] for v in rs]), med([v[t][4] + v[t][5] for v in rs]))
                hcpu = med([v['haproxy'][2] for v in rs]); p99 = med([v[t][1] for v in rs]); hp99 = med([v['haproxy'][1] for v in rs])
                print(f'pass {p+1} load {load:>5} {label:12} {t:20} c={c:>3} cpu {cpu:6.2f} (hp {hcpu:6.2f}) µs/rt p99 {p99/1000:.2f} (hp {hp99/1000:.2f}) ms  vs hp {rc:.2f} [{" ".join("%.2f" % (v[t][2]/v["haproxy"][2]) for v in rs)}]  req/s {rq:.2f}  p99 {rp:.2f}{extra}', flush=True)
