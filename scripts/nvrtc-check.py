#!/usr/bin/env python3
"""Compile ft's CUDA sources with NVRTC on a machine without a GPU, as ft-runtime does at run
time (same options: kernels/src/cuda_sources.rs and runtime/src/nvrtc.rs), and print each
kernel's registers, shared memory and spills (ptxas -v through NVRTC).

Why: a compile error found on the GPU machine costs a device call; NVRTC needs no GPU. Get a
libnvrtc without installing CUDA from the NVIDIA wheel on PyPI:

    pip download --no-deps -d /tmp/nv nvidia-cuda-nvrtc && unzip -o -q /tmp/nv/*.whl -d /tmp/nv/x
    scripts/nvrtc-check.py --lib /tmp/nv/x/nvidia/cu13/lib/libnvrtc.so.13

Usage: scripts/nvrtc-check.py [--lib PATH] [--arch 90] [--unit experts] [--spec FMT:ACT ...]
                              [--cubin-dir DIR]   (then: cuobjdump -sass DIR/experts-31-sm90.cubin)
(FMT: 0 bf16, 1 int8, 2 q4_0, 3 nvfp4, 4 mxfp4; ACT: 0 f32, 1 int8). Exit 1 on a compile error.
"""
import argparse
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = ["experts", "gather", "dense", "elementwise"]


def compile_unit(lib, unit, arch, defines, cubin_path=None):
    common = open(os.path.join(ROOT, "kernels/cuda/common.cuh")).read()
    src = open(os.path.join(ROOT, f"kernels/cuda/{unit}.cu")).read()
    full = f"{common}\n// ---- {unit}.cu ----\n{src}".encode()
    opts = [f"--gpu-architecture=sm_{arch}", "--fmad=false", "--std=c++17", "-default-device",
            "-lineinfo", f"-DFT_KERNEL_{unit.upper()}", "--ptxas-options=-v"] + defines
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), full, f"{unit}.cu".encode(), 0, None, None)
    assert rc == 0, rc
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    if rc == 0 and cubin_path:
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        image = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, image)
        with open(cubin_path, "wb") as f:
            f.write(image.raw)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, buf.value.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FT_NVRTC_LIB", "libnvrtc.so"))
    ap.add_argument("--arch", default="90")
    ap.add_argument("--unit", action="append")
    ap.add_argument("--spec", action="append", help="FMT:ACT for the experts unit")
    ap.add_argument("--full-log", action="store_true")
    ap.add_argument("--cubin-dir", help="also write each module's cubin here (for cuobjdump -sass)")
    ap.add_argument("--define", action="append", default=[],
                    help="extra NAME=VALUE preprocessor definition (repeatable), e.g. FT_E2M1_SPLIT=1")
    a = ap.parse_args()
    lib = ctypes.CDLL(a.lib)
    failed = False
    for unit in a.unit or UNITS:
        specs = [[]]
        if unit == "experts":
            specs = [[f"-DFT_FMT={s.split(':')[0]}", f"-DFT_ACT={s.split(':')[1]}"]
                     for s in (a.spec or ["3:1", "3:0", "0:0", "1:1", "2:1", "4:1"])]
        for d in specs:
            d = d + [f"-D{x}" for x in a.define]
            cubin = None
            if a.cubin_dir:
                os.makedirs(a.cubin_dir, exist_ok=True)
                tag = "".join(x.split("=")[1] for x in d) or "none"
                cubin = os.path.join(a.cubin_dir, f"{unit}-{tag}-sm{a.arch}.cubin")
            rc, log = compile_unit(lib, unit, a.arch, d, cubin)
            print(f"== {unit} {' '.join(d)} sm_{a.arch}: {'ok' if rc == 0 else f'FAILED ({rc})'}")
            failed |= rc != 0
            lines = log.splitlines()
            if rc != 0 or a.full_log:
                print(log)
                continue
            fn = None
            for ln in lines:
                if "Compiling entry function" in ln:
                    fn = ln.split("'")[1]
                elif "Used" in ln and fn:
                    print(f"  {fn:28s} {ln.split('info    :')[-1].strip()}")
                elif ("spill" in ln and not ln.strip().endswith("0 bytes spill loads")
                      and "0 bytes spill stores, 0 bytes spill loads" not in ln and fn):
                    print(f"  {fn:28s} {ln.split('info    :')[-1].strip()}")
                elif "warning" in ln or "error" in ln:
                    print("  " + ln)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
