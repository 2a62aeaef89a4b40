#!/bin/sh
# keep-corpus.sh PKGDIR IMPORTPATH TARGET: keep a bounded subset of the fuzz
# corpus for TARGET in PKGDIR/testdata/fuzz/TARGET, so the next run (on any
# machine) starts from the coverage this one found.
#
# Go writes only crashers to testdata/fuzz; inputs that found new coverage
# stay in $GOCACHE/fuzz/IMPORTPATH/TARGET. The coordinator minimizes each of
# those before keeping it, so they are already small. The candidates are
# those cache entries together with the cache-* files already committed (a
# run on a fresh machine caches only what it found beyond them, so they
# must not be dropped for that alone). Of the candidates we keep the
# smallest FUZZ_KEEP (default 64) that are at most FUZZ_KEEP_BYTES (default
# 4096) bytes each, named cache-<hash>. Every other file there (crash
# reproducers, regression-* inputs) is left alone, so a regression input is
# never dropped.
set -eu
pkgdir=$1 importpath=$2 target=$3
keep=${FUZZ_KEEP:-64}
maxbytes=${FUZZ_KEEP_BYTES:-4096}
src="$(go env GOCACHE)/fuzz/$importpath/$target"
dst="$pkgdir/testdata/fuzz/$target"
pool=$(mktemp -d)
trap 'rm -rf "$pool"' EXIT
if [ -d "$dst" ]; then
	for f in "$dst"/cache-*; do
		[ -f "$f" ] && cp "$f" "$pool/${f##*/cache-}"
	done
fi
[ -d "$src" ] && cp "$src"/* "$pool"/ 2>/dev/null || true
mkdir -p "$dst"
rm -f "$dst"/cache-*
n=0
# Smallest first; ties by name, so the same candidates give the same files.
for f in $(find "$pool" -type f -size -"$((maxbytes + 1))"c -printf '%s %f\n' | sort -k1,1n -k2,2 | head -n "$keep" | cut -d' ' -f2); do
	cp "$pool/$f" "$dst/cache-$f"
	n=$((n + 1))
done
echo "keep-corpus: $target: kept $n of $(find "$pool" -type f | wc -l) candidates"
