#!/usr/bin/env python3
"""List the functions in src/ longer than a limit (default 200 lines).

Crude on purpose: a function runs from its signature line (a line at column 0
that opens a definition, ending in '{') to the next line that is exactly '}'.
Usage: tools/long-functions.py [--max N] [DIR...]   (exit 1 when one is over)
"""
import os
import re
import sys

SIG = re.compile(r'^[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;]*$')


def scan(path):
    out = []
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = f.read().split('\n')
    i = 0
    while i < len(lines):
        m = SIG.match(lines[i])
        if m and not lines[i].startswith(('typedef', 'struct', 'enum', 'union', '#', 'static const', 'const')) \
                and '=' not in lines[i].split('(')[0]:
            # the signature may span lines: find the '{' that opens the body
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith('{') and not lines[j].rstrip().endswith(';'):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith('{'):
                k = j + 1
                while k < len(lines) and lines[k] != '}':
                    k += 1
                out.append((k - i + 1, path, m.group(1)))
                i = k + 1
                continue
        i += 1
    return out


def main():
    args = sys.argv[1:]
    limit = 200
    if args[:1] == ['--max']:
        limit = int(args[1])
        args = args[2:]
    roots = args or ['src']
    found = []
    for root in roots:
        for d, _, files in os.walk(root):
            for fn in files:
                if fn.endswith(('.c', '.h', '.cpp', '.cu')):
                    found += scan(os.path.join(d, fn))
    found.sort(reverse=True)
    over = [f for f in found if f[0] > limit]
    for n, path, name in over:
        print(f'{n:5d} {path} {name}')
    return 1 if over else 0


if __name__ == '__main__':
    sys.exit(main())
