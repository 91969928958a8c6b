#!/usr/bin/env bash
# Packs CUDA binaries built here into one carry file for the GPU machine (the device tool carries
# at most 64 MiB beside the tracked tree; the unpacked binaries are ~140 MB):
#   bash tools/cuda/pack_binaries.sh [--build DIR] [--base QWENRT] [--out FILE]
# DIR (default build): its qwenrt, qwenrt_tests, cuda_gemv_bench and libqwenrt_timeline.so, those
# present, go in as build-cuda/<name>, stripped, with libcupti (for the timeline) where CUDA has
# it. --base adds another qwenrt as build-base/qwenrt, for A/B runs against it
# (bench/h200/decode_ab.sh BIN=build-base/qwenrt). FILE (default .carry/bin.tar.xz): xz with a
# dictionary larger than the archive, so binaries built from nearly the same source share their
# bytes: a second qwenrt added 0.3 MB (all six files 12.1 MB, against 33.5 MB at xz -6).
# On the GPU machine: carry [".carry"]; tools/cuda/device_check.sh and bench/h200/decode_ab.sh
# unpack it themselves, anything else that reads build-cuda/ (bench/h200/run.sh) needs
# `tar xJf .carry/bin.tar.xz` first.
set -euo pipefail
build=build
base=""
out=.carry/bin.tar.xz
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "pack_binaries.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$build/qwenrt" ] || { echo "pack_binaries.sh: no $build/qwenrt (build it first)" >&2; exit 1; }
[ -z "$base" ] || [ -x "$base" ] || { echo "pack_binaries.sh: no executable '$base'" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-cuda"
names=()
for f in qwenrt qwenrt_tests cuda_gemv_bench libqwenrt_timeline.so; do
  [ -e "$build/$f" ] || continue
  cp "$build/$f" "$stage/build-cuda/"
  strip "$stage/build-cuda/$f" 2>/dev/null || true
  names+=("build-cuda/$f")
done
# Neighbours in the archive, so the dictionary finds the second qwenrt's bytes in the first.
if [ -n "$base" ]; then
  mkdir -p "$stage/build-base"
  cp "$base" "$stage/build-base/qwenrt"
  strip "$stage/build-base/qwenrt" 2>/dev/null || true
  names=("build-cuda/qwenrt" "build-base/qwenrt" "${names[@]:1}")
fi
if [ -e "$build/libqwenrt_timeline.so" ]; then
  cupti=""
  for c in /usr/local/cuda/lib64/libcupti.so.* /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.*; do
    [[ $c =~ libcupti\.so\.[0-9]+$ ]] && [ -e "$c" ] && { cupti=$c; break; }
  done
  if [ -n "$cupti" ]; then
    cp -L "$cupti" "$stage/build-cuda/"
    names+=("build-cuda/$(basename "$cupti")")
  fi
fi
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - "${names[@]}" | xz -T1 --lzma2=preset=9,dict=192MiB > "$out"
echo "$out: $(du -h "$out" | cut -f1) (${names[*]})"
