// Package deploytest holds the tests of deploy/kubernetes: every manifest
// decodes strictly into the Kubernetes API types (an unknown or misspelt
// field fails), and the manifests agree with mongobouncer itself (probe
// paths answered by the real binary, ports, the grace period against the
// configured drain, the ConfigMap's configuration accepted by
// `mongobouncer --check`). It is a module of its own so that k8s.io/api
// never enters the main go.mod; `make test` runs it.
package deploytest
