#!/usr/bin/env python3
"""cgdiff.py A:IR_PER_RT B:IR_PER_RT [N]: self and inclusive instructions per round trip of each
function in two callgrind files (uncompressed names), scaled so that each file's total is its
instructions per round trip; prints the N largest differences (B - A)."""
import sys, re, collections
def load(path):
    selfc = collections.Counter(); incl = collections.Counter()
    fn = None; after_calls = False; total = 0
    for line in open(path, errors='replace'):
        if line.startswith('summary:'): total = int(line.split()[1])
        if line.startswith('fn='): fn = line[3:].strip(); after_calls = False; continue
        if line.startswith('calls='): after_calls = True; continue
        m = re.match(r'^[+-]?\d+ (\d+)$', line.strip()) or re.match(r'^\* (\d+)$', line.strip())
        if m and fn:
            c = int(m.group(1))
            if after_calls: incl[fn] += c; after_calls = False
            else: selfc[fn] += c; incl[fn] += c
    return selfc, incl, total
args = sys.argv[1:]
(pa, ra), (pb, rb) = [a.rsplit(':', 1) for a in args[:2]]
n = int(args[2]) if len(args) > 2 else 40
sa, ia, ta = load(pa); sb, ib, tb = load(pb)
ka = float(ra) / ta; kb = float(rb) / tb
for title, A, B in (('self', sa, sb), ('inclusive', ia, ib)):
    print(f'== {title}: per round trip, {pa} -> {pb}')
    keys = set(A) | set(B)
    rows = sorted(keys, key=lambda k: -abs(B[k]*kb - A[k]*ka))[:n]
    for k in rows:
        print(f'{A[k]*ka:9.0f} {B[k]*kb:9.0f} {B[k]*kb - A[k]*ka:+8.0f}  {k[:150]}')
