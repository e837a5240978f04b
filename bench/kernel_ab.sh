#!/usr/bin/env bash
# kernel_ab.sh - a kernel file at a git revision (A) against the working
# tree's (B), both in one process, alternated (bench/kernel_ab.c for the
# matmul files, bench/attn_ab.c for the attention ones).
#
#   bench/kernel_ab.sh REV [FILE] [q4|q8|q6k|q3k|q2k] [vnni|plain]
#     REV   the revision for A (e.g. HEAD, or HEAD~1 once B is committed)
#     FILE  kernels/cpu/qmatmul_avx512.c (default) or kernels/cpu/qmatmul_avx2.c
#     q4|q8|q6k|q3k|q2k  the matrix: Q4_1 1536x576, Q8_0 4096x576, or Q6_K,
#           Q3_K, Q2_K 576x1536 (default q4)
#     vnni|plain  the file's VNNI kernels or its other ones (default vnni)
#   bench/kernel_ab.sh REV kernels/cpu/vec_avx512.c|vec_avx2.c [P,P,...] [T]
#     a step's attention over P cached rows (default 1000,3000) for T new
#     tokens (default 1: decode; 5 or 9: a verified chain)
#
# Needs a configured build/ (cmake --build build): it links build/'s
# libraries. Prints a markdown table; exits 1 if A and B differ in any bit.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/kernel_ab.sh REV [FILE] [q4|q8|q6k|q3k|q2k|P,P,...] [vnni|plain]}
file=${2:-kernels/cpu/qmatmul_avx512.c}
case $file in
*qmatmul_avx512.c) sym=cpu_qkernels_avx512 main=kernel_ab A=ks_A B=ks_B ;;
*qmatmul_avx2.c) sym=cpu_qkernels_avx2 main=kernel_ab A=ks_A B=ks_B ;;
*vec_avx512.c) sym=cpu_vec_avx512 main=attn_ab A=vs_A B=vs_B ;;
*vec_avx2.c) sym=cpu_vec_avx2 main=attn_ab A=vs_A B=vs_B ;;
*) echo "kernel_ab: $file is not a qmatmul or vec SIMD file" >&2; exit 2 ;;
esac
# the kernels run unchecked: refuse a file this CPU cannot execute
case $file in
*avx512.c) need=avx512bw ;;
*) need=avx2 ;;
esac
grep -qw "$need" /proc/cpuinfo || { echo "kernel_ab: this CPU lacks $need for $file" >&2; exit 2; }
if [ "$main" = kernel_ab ]; then
    args=("${3:-q4}")
    case ${4:-vnni} in vnni) args+=(1) ;; plain) args+=(0) ;; *) echo "vnni or plain" >&2; exit 2 ;; esac
else
    args=("${3:-1000,3000}" "${4:-1}")
fi
for lib in kernels spec util; do
    [ -f "build/libspecd_$lib.a" ] || { echo "kernel_ab: build/libspecd_$lib.a missing: cmake --build build first" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git show "$rev:$file" > "$tmp/a.c"
cp "$file" "$tmp/b.c"
cc=${CC:-cc}
flags=(-O3 -std=gnu11 -I. -Ikernels/cpu)
"$cc" "${flags[@]}" "-D$sym=$A" -c "$tmp/a.c" -o "$tmp/a.o"
"$cc" "${flags[@]}" "-D$sym=$B" -c "$tmp/b.c" -o "$tmp/b.o"
"$cc" -O2 -std=gnu11 -I. -o "$tmp/ab" "bench/$main.c" "$tmp/a.o" "$tmp/b.o" \
    build/libspecd_kernels.a build/libspecd_spec.a build/libspecd_util.a -lm -lpthread
echo "A: $file at $(git rev-parse --short "$rev"); B: the working tree"
"$tmp/ab" "${args[@]}"
