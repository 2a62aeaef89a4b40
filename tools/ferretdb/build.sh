#!/bin/sh
# build.sh OUT builds FerretDB's own command (cmd/ferretdb of the version
# tools/devmongo requires) into OUT, for the tests that need an upstream
# with authentication: only that command offers SCRAM
# (--test-enable-new-auth), the embeddable package does not.
#
# Built straight from the module cache the binary panics at start: the
# published module lacks the generated build/version/version.txt, and the
# module cache is read-only (and -overlay does not reach //go:embed). So the
# module is copied beside OUT, the file is added, and tools/ferretdb/go.mod
# builds it through a replace directive to that copy (bin/ferretdb-src).
set -eu
out=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=$root/bin/ferretdb-src
GO=${GO:-go}
# tools/devmongo's go.sum pins the module; downloading through it verifies it.
ver=$(cd "$root/tools/devmongo" && $GO list -m -f '{{.Version}}' github.com/FerretDB/FerretDB)
(cd "$root/tools/devmongo" && $GO mod download github.com/FerretDB/FerretDB)
dir=$(cd "$root/tools/devmongo" && $GO list -m -f '{{.Dir}}' github.com/FerretDB/FerretDB)
rm -rf "$src"
mkdir -p "$(dirname "$src")"
cp -R "$dir" "$src"
chmod -R u+w "$src"
echo "$ver" >"$src/build/version/version.txt"
cd "$here" && $GO build -o "$out" github.com/FerretDB/FerretDB/cmd/ferretdb
