#!/bin/sh
# keep-corpus.sh PKGDIR IMPORTPATH TARGET: copy a bounded subset of the fuzz
# cache's corpus for TARGET into PKGDIR/testdata/fuzz/TARGET, so the next
# run (on any machine) starts from the coverage this one found.
#
# Go writes only crashers to testdata/fuzz; inputs that found new coverage
# stay in $GOCACHE/fuzz/IMPORTPATH/TARGET. The coordinator minimizes each of
# those before keeping it, so they are already small. We keep the smallest
# FUZZ_KEEP of them (default 64) that are at most FUZZ_KEEP_BYTES (default
# 4096) bytes each, named cache-<hash>. Earlier cache-* files are replaced;
# every other file there (crash reproducers, hand-written seeds) is left
# alone, so a regression input is never dropped.
set -eu
pkgdir=$1 importpath=$2 target=$3
keep=${FUZZ_KEEP:-64}
maxbytes=${FUZZ_KEEP_BYTES:-4096}
src="$(go env GOCACHE)/fuzz/$importpath/$target"
dst="$pkgdir/testdata/fuzz/$target"
[ -d "$src" ] || { echo "keep-corpus: no cache corpus for $importpath $target"; exit 0; }
mkdir -p "$dst"
rm -f "$dst"/cache-*
n=0
# Smallest first; ties by name, so the same cache gives the same files.
for f in $(find "$src" -type f -size -"$((maxbytes + 1))"c -printf '%s %f\n' | sort -k1,1n -k2,2 | head -n "$keep" | cut -d' ' -f2); do
	cp "$src/$f" "$dst/cache-$f"
	n=$((n + 1))
done
echo "keep-corpus: $target: kept $n of $(find "$src" -type f | wc -l) cache entries"
