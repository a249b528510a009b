# shellcheck shell=bash
# Sourced by the scripts that run ft on the GPU machine: where libcuda and libnvrtc live
# there (the driver's mount, the toolkit, pip wheels), added to LD_LIBRARY_PATH (exported)
# so that the cuda build of ft finds them. The directories that exist are appended in
# this order; where the toolkit holds no libnvrtc, the first one found under /usr/local or
# /opt is appended too.
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 \
         /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
if ! ls /usr/local/cuda/lib64/libnvrtc.so* > /dev/null 2>&1; then
    nvrtc=$(find /usr/local /opt -name 'libnvrtc.so.1*' -print -quit 2> /dev/null)
    [[ -n "$nvrtc" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$nvrtc")"
    unset nvrtc
fi
export LD_LIBRARY_PATH
