// Package e2e holds end-to-end tests: real drivers and clients talk to a
// whole mongobouncer (internal/app) in front of the embedded FerretDB dev
// server or the scripted fake mongod.
package e2e
