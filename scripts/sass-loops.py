#!/usr/bin/env python3
"""The innermost loops of a kernel's SASS and what they issue, without a GPU.

Reads `cuobjdump -sass -fun NAME CUBIN` output (scripts/nvrtc-check.py --cubin-dir writes
the cubins), finds every loop (a branch back to a lower address) that holds integer dot
products (IDP), and prints the shortest ones with their instruction counts by opcode. For
comparing decode variants of the expert kernels statically: the batch-1 kernels are issue-
and ALU-bound on the H200 (experiments/gpu-backend, ncu.txt), so fewer ALU instructions per
weight is what a change there has to show before a GPU measures it.

Usage: scripts/sass-loops.py FILE.sass [--top N]
"""
import argparse
import collections
import re

# Opcodes issued to the integer/logic ALU pipe on sm_90 (the pipe ncu saw busiest).
ALU = ("LOP3", "PRMT", "SHF", "ISETP", "IADD3", "LEA", "SEL", "FSEL", "FMNMX", "VIADD")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    ins = []
    for line in open(a.sass):
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+([^;]+);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [t for x, t in ins if lo <= x <= addr]
            ops = collections.Counter(re.sub(r"^@!?U?P\d\s+", "", t).split()[0] for t in body)
            idp = sum(v for k, v in ops.items() if k.startswith("IDP"))
            if idp:
                loops.append((len(body), lo, addr, idp, ops))
    print(f"{len(ins)} instructions; {len(loops)} loops with integer dot products")
    for n, lo, hi, idp, ops in sorted(loops)[: a.top]:
        alu = sum(v for k, v in ops.items() if k.split(".")[0] in ALU)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"loop 0x{lo:x}-0x{hi:x}: {n} instructions, {idp} IDP, {alu} on the ALU pipe ({top})")


if __name__ == "__main__":
    main()
