#!/usr/bin/env python3
"""Compile the CUDA modules the default path builds (every kernel unit; the expert unit once
per format and activation path, with the definitions the runtime passes by default) with
NVRTC for one architecture, disassemble each module with cuobjdump, and compare two trees
kernel by kernel, instruction by instruction.

Why: the CUDA sources cannot run on a machine without a GPU, but a change that must leave
the default path alone can be shown to: the same source path compiles to the same machine
code. Needs NVRTC and cuobjdump from NVIDIA's PyPI wheels:

    pip download --no-deps -d dl nvidia-cuda-nvrtc nvidia-cuda-cuobjdump
    for w in dl/*.whl; do unzip -o -q $w -d x; done

Usage:
    static_default.py dump --lib x/nvidia/cu13/lib/libnvrtc.so.13 --cuobjdump x/nvidia/cu13/bin/cuobjdump \
        --root TREE --out DIR [--arch 90]
    static_default.py compare BEFORE_DIR AFTER_DIR      (exit 1 when a kept kernel differs)
"""
import argparse
import ctypes
import json
import os
import re
import subprocess
import sys

UNITS = ["experts", "gather", "dense", "elementwise"]
# (format, activation) pairs the runtime builds the expert unit for: bf16 runs f32 only; the
# others both paths (ActivationPath::supports).
EXPERT_SPECS = [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (4, 1)]
NVFP4, MXFP4, ACT_INT8 = 3, 4, 1


def default_defines(fmt, act):
    """The definitions the default path adds for one expert module: the split-sign e2m1 dot
    (nvfp4 and mxfp4 on the int8 path) and the hardware e4m3 scale decode (nvfp4)."""
    d = [f"-DFT_FMT={fmt}", f"-DFT_ACT={act}"]
    if fmt in (NVFP4, MXFP4) and act == ACT_INT8:
        d.append("-DFT_E2M1_SPLIT=1")
    if fmt == NVFP4:
        d.append("-DFT_E4M3_CVT=1")
    return d


def compile_unit(lib, root, unit, arch, defines):
    common = open(os.path.join(root, "kernels/cuda/common.cuh")).read()
    src = open(os.path.join(root, f"kernels/cuda/{unit}.cu")).read()
    full = f"{common}\n// ---- {unit}.cu ----\n{src}".encode()
    # The options of runtime/src/nvrtc.rs compile_options.
    opts = [f"--gpu-architecture=sm_{arch}", "--fmad=false", "--std=c++17", "-default-device",
            "-lineinfo", f"-DFT_KERNEL_{unit.upper()}"] + defines
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), full, f"{unit}.cu".encode(), 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"{unit} {defines}: compile failed\n{log.value.decode(errors='replace')}")
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    image = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, image)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return image.raw, opts


def sass_functions(text):
    """Function name -> its instructions (address and encoding stripped)."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and name:
            out[name].append(m.group(1))
    return out


def dump(a):
    lib = ctypes.CDLL(a.lib)
    os.makedirs(a.out, exist_ok=True)
    modules = {}
    for unit in UNITS:
        specs = [default_defines(f, c) for f, c in EXPERT_SPECS] if unit == "experts" else [[]]
        for d in specs:
            tag = unit + "".join("-" + x.split("=")[0][5:].lower() + x.split("=")[1] for x in d)
            cubin, opts = compile_unit(lib, a.root, unit, a.arch, d)
            path = os.path.join(a.out, f"{tag}.cubin")
            open(path, "wb").write(cubin)
            sass = subprocess.run([a.cuobjdump, "-sass", path], check=True,
                                  capture_output=True, text=True).stdout
            open(os.path.join(a.out, f"{tag}.sass"), "w").write(sass)
            modules[tag] = {"options": opts, "functions": sass_functions(sass)}
            print(f"{tag}: {len(modules[tag]['functions'])} kernels")
    json.dump(modules, open(os.path.join(a.out, "modules.json"), "w"))


def normalized(instrs):
    """The instructions with register numbers and code addresses abstracted away: two
    listings equal under it differ only in register allocation and layout."""
    out = []
    for i in instrs:
        i = re.sub(r"\bU?R\d+\b", "R", i)
        i = re.sub(r"\bU?P\d\b", "P", i)
        i = re.sub(r"\bB\d+\b", "B", i)
        i = re.sub(r"0x[0-9a-f]+", "N", i)
        out.append(i)
    return out


def opcode_counts(instrs):
    """Opcode (predicate and modifiers dropped: `@!P0 IMAD.MOV.U32 R1` -> IMAD) -> count."""
    counts = {}
    for i in instrs:
        words = [w for w in i.split() if not w.startswith("@")]
        if words:
            op = words[0].split(".")[0]
            counts[op] = counts.get(op, 0) + 1
    return counts


def delta(fb, fa):
    """The opcodes whose counts differ, as `OP before->after`, NOP padding left out."""
    cb, ca = opcode_counts(fb), opcode_counts(fa)
    return ", ".join(f"{op} {cb.get(op, 0)}->{ca.get(op, 0)}"
                     for op in sorted(set(cb) | set(ca))
                     if op != "NOP" and cb.get(op, 0) != ca.get(op, 0)) or "no opcode count differs"


# The instructions that compute a result or move data: float arithmetic, the integer dot and
# byte permutes of the dot products, conversions, shuffles, barriers and every load, store
# and atomic. Address arithmetic, moves, predicates and branches are left out: register
# allocation and scheduling move them.
WORK_OPCODES = {
    "FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "IDP", "PRMT", "I2FP", "F2FP", "F2F",
    "SHFL", "BAR", "MEMBAR", "LDG", "LDS", "LD", "STG", "STS", "ST", "LDGSTS", "DEPBAR",
    "ATOM", "ATOMG", "RED", "REDG", "CCTL", "ERRBAR",
}


def work_delta(fb, fa):
    """The work opcodes ([`WORK_OPCODES`]) whose counts differ, or an empty string."""
    cb, ca = opcode_counts(fb), opcode_counts(fa)
    return ", ".join(f"{op} {cb.get(op, 0)}->{ca.get(op, 0)}" for op in sorted(WORK_OPCODES)
                     if cb.get(op, 0) != ca.get(op, 0))


def compare(a):
    before = json.load(open(os.path.join(a.before, "modules.json")))
    after = json.load(open(os.path.join(a.after, "modules.json")))
    differ = 0
    for tag in before:
        if tag not in after:
            print(f"{tag}: module missing after")
            differ += 1
            continue
        fb, fa = before[tag]["functions"], after[tag]["functions"]
        same = [f for f in fb if f in fa and fb[f] == fa[f]]
        renamed = [f for f in fb if f in fa and fb[f] != fa[f]
                   and normalized(fb[f]) == normalized(fa[f])]
        changed = [f for f in fb if f in fa and normalized(fb[f]) != normalized(fa[f])]
        removed = [f for f in fb if f not in fa]
        added = [f for f in fa if f not in fb]
        print(f"{tag}: {len(same)} identical, {len(renamed)} identical but for register "
              f"numbers and addresses, {len(changed)} changed, {len(removed)} removed, "
              f"{len(added)} added")
        for f in renamed:
            print(f"  registers {f}: {len(fb[f])} instructions, {delta(fb[f], fa[f])}")
        for f in changed:
            print(f"  changed {f}: {len(fb[f])} -> {len(fa[f])} instructions: {delta(fb[f], fa[f])}")
        work = {f: work_delta(fb[f], fa[f]) for f in changed + renamed}
        differing = {f: w for f, w in work.items() if w}
        if changed:
            print(f"  work instructions (float, dot, conversions, loads, stores, shuffles, "
                  f"barriers, atomics) of the changed kernels: "
                  + ("the same counts in every one" if not differing else
                     "; ".join(f"{f}: {w}" for f, w in differing.items())))
        for f in removed:
            print(f"  removed {f}")
        for f in added:
            print(f"  added {f}")
        differ += len(changed) + len(added)
    print("every kept kernel the same up to register numbers" if differ == 0
          else f"{differ} kept kernels or modules changed beyond register numbers")
    sys.exit(1 if differ else 0)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--lib", required=True)
    d.add_argument("--cuobjdump", required=True)
    d.add_argument("--root", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--arch", default="90")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    a = ap.parse_args()
    dump(a) if a.cmd == "dump" else compare(a)


if __name__ == "__main__":
    main()
